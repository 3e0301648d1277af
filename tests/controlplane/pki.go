package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the throw-away trust of one apiserver run: a CA that signs the serving certificate and
// the admin's client certificate, and the service-account signing key.
type pki struct {
	caCert, caKey                string // CA certificate (also the client CA) and its key
	servingCert, servKey         string
	adminCert, adminKey          string
	saKey, saPub                 string
	caPEM, adminPEM, adminKeyPEM []byte
}

const pkiValidity = 24 * time.Hour

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, parentKey crypto.Signer) (*x509.Certificate, []byte, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func writeFiles(files map[string][]byte) error {
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func newPKI(dir string) (*pki, error) {
	now := time.Now().Add(-time.Minute)
	p := &pki{
		caCert: filepath.Join(dir, "ca.crt"), caKey: filepath.Join(dir, "ca.key"),
		servingCert: filepath.Join(dir, "apiserver.crt"), servKey: filepath.Join(dir, "apiserver.key"),
		adminCert: filepath.Join(dir, "admin.crt"), adminKey: filepath.Join(dir, "admin.key"),
		saKey: filepath.Join(dir, "sa.key"), saPub: filepath.Join(dir, "sa.pub"),
	}
	caKey, caKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: "topo-reporter-test-ca"},
		NotBefore: now, NotAfter: now.Add(pkiValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true,
	}
	ca, caPEM, err := sign(caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	p.caPEM = caPEM

	servKey, servKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	if sn, err = serial(); err != nil {
		return nil, err
	}
	_, servPEM, err := sign(&x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now, NotAfter: now.Add(pkiValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		// 10.96.0.1: the `kubernetes` Service's address, which pods on `node` dial.
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}, ca, servKey.Public(), caKey)
	if err != nil {
		return nil, err
	}

	adminKey, adminKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	if sn, err = serial(); err != nil {
		return nil, err
	}
	// system:masters is what kubeadm's admin.conf carries: every request is allowed, by RBAC's
	// superuser group, without any binding.
	_, adminPEM, err := sign(&x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: "kubernetes-admin", Organization: []string{"system:masters"}},
		NotBefore: now, NotAfter: now.Add(pkiValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, adminKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	p.adminPEM, p.adminKeyPEM = adminPEM, adminKeyPEM

	saKey, saKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	err = writeFiles(map[string][]byte{
		p.caCert: caPEM, p.caKey: caKeyPEM,
		p.servingCert: servPEM, p.servKey: servKeyPEM,
		p.adminCert: adminPEM, p.adminKey: adminKeyPEM,
		p.saKey: saKeyPEM, p.saPub: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
	})
	if err != nil {
		return nil, fmt.Errorf("writing certificates to %s: %w", dir, err)
	}
	return p, nil
}
