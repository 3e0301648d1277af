package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	basecompatibility "k8s.io/component-base/compatibility"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

const (
	// Bounds on waiting: a cold start on two busy cores takes seconds, not minutes.
	etcdReadyTimeout      = 60 * time.Second
	apiserverReadyTimeout = 3 * time.Minute
	shutdownTimeout       = 30 * time.Second
	etcdStartAttempts     = 3
)

func runAPIServer(args []string) error {
	fs := flag.NewFlagSet("apiserver", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "write the admin kubeconfig to this `FILE` once /readyz answers (required)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: controlplane apiserver --kubeconfig FILE [-- KUBE-APISERVER-FLAGS...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" {
		return errors.New("--kubeconfig FILE is required: where to write the admin kubeconfig")
	}
	kubeconfigPath, err := filepath.Abs(*kubeconfig)
	if err != nil {
		return err
	}
	started := time.Now()
	ctx := genericapiserver.SetupSignalContext()

	dir, err := os.MkdirTemp("", "controlplane-apiserver-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	etcd, etcdURL, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return fmt.Errorf("embedded etcd: %w", err)
	}
	defer func() {
		etcd.Close()
		<-etcd.Server.StopNotify()
	}()

	certs, err := newPKI(dir)
	if err != nil {
		return err
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening on loopback: %w", err)
	}
	port := listener.Addr().(*net.TCPAddr).Port

	completed, err := apiserverOptions(ctx, dir, etcdURL, certs, listener, fs.Args())
	if err != nil {
		return err
	}
	errCh := make(chan error, 1)
	go func() { errCh <- app.Run(ctx, completed) }()

	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	if err := waitReady(ctx, server, certs, errCh); err != nil {
		return err
	}
	if err := writeKubeconfig(kubeconfigPath, server, certs); err != nil {
		return err
	}
	defer os.Remove(kubeconfigPath)
	fmt.Printf("apiserver %s ready in %.2fs, kubeconfig %s\n", server, time.Since(started).Seconds(), kubeconfigPath)

	select {
	case err := <-errCh:
		if err != nil {
			return fmt.Errorf("kube-apiserver stopped: %w", err)
		}
		return errors.New("kube-apiserver stopped")
	case <-ctx.Done():
	}
	select {
	case err := <-errCh:
		return err
	case <-time.After(shutdownTimeout):
		return fmt.Errorf("kube-apiserver did not stop within %s of SIGTERM", shutdownTimeout)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts a one-member etcd on loopback. etcd binds its own URLs, so a free port is picked
// first and the start retried should another process take it in between.
func startEtcd(dir string) (*embed.Etcd, string, error) {
	var lastErr error
	for attempt := 0; attempt < etcdStartAttempts; attempt++ {
		clientPort, err := freePort()
		if err != nil {
			return nil, "", err
		}
		peerPort, err := freePort()
		if err != nil {
			return nil, "", err
		}
		cfg := embed.NewConfig()
		cfg.Name = "controlplane"
		cfg.Dir = filepath.Join(dir, fmt.Sprint(attempt))
		cfg.LogLevel = "error"
		// Test data: losing it on a crash costs nothing, and fsync dominates etcd's write latency.
		cfg.UnsafeNoFsync = true
		clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
		peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			lastErr = err
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
			return e, clientURL.String(), nil
		case err := <-e.Err():
			e.Close()
			lastErr = err
		case <-time.After(etcdReadyTimeout):
			e.Close()
			return nil, "", fmt.Errorf("not ready within %s", etcdReadyTimeout)
		}
	}
	return nil, "", lastErr
}

// apiserverOptions builds the options exactly as the kube-apiserver command does from its flags,
// except that the serving socket is the loopback listener already open (no port race).
func apiserverOptions(ctx context.Context, dir, etcdURL string, certs *pki, listener net.Listener, extra []string) (options.CompletedOptions, error) {
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, set := range s.Flags().FlagSets {
		fs.AddFlagSet(set)
	}
	flags := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--cert-dir=" + dir,
		"--tls-cert-file=" + certs.servingCert,
		"--tls-private-key-file=" + certs.servKey,
		"--client-ca-file=" + certs.caCert,
		"--authorization-mode=Node,RBAC",
		// ValidatingAdmissionPolicy is among the default plugins; NodeRestriction is what every
		// real cluster adds.
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + certs.saPub,
		"--service-account-signing-key-file=" + certs.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--profiling=false",
		// The kubernetes Service's endpoints would be 127.0.0.1, which Endpoints validation
		// refuses; pods on `node` reach the apiserver through the Service's address, which the
		// node carries to loopback itself.
		"--endpoint-reconciler-type=none",
		// A node registers a Hostname address too: looking that up would send a DNS query off
		// the machine (`kubectl logs`). The InternalIP is the node harness's bridge address.
		"--kubelet-preferred-address-types=InternalIP",
	}
	if err := fs.Parse(append(flags, extra...)); err != nil {
		return options.CompletedOptions{}, err
	}
	s.SecureServing.Listener = listener
	s.SecureServing.BindPort = listener.Addr().(*net.TCPAddr).Port

	registry := s.GenericServerRunOptions.ComponentGlobalsRegistry
	if err := registry.Set(); err != nil {
		return options.CompletedOptions{}, err
	}
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	if err := logsapi.ValidateAndApply(s.Logs, registry.FeatureGateFor(basecompatibility.DefaultKubeComponent)); err != nil {
		return options.CompletedOptions{}, err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return options.CompletedOptions{}, err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return options.CompletedOptions{}, errors.Join(errs...)
	}
	return completed, nil
}

func adminTLS(certs *pki) (*tls.Config, error) {
	pair, err := tls.X509KeyPair(certs.adminPEM, certs.adminKeyPEM)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certs.caPEM)
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}

// waitReady waits for /readyz, then for the default namespace, which the bootstrap controller
// creates just after: clients that post Events there must not race it.
func waitReady(ctx context.Context, server string, certs *pki, errCh <-chan error) error {
	tlsConfig, err := adminTLS(certs)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(apiserverReadyTimeout)
	for _, path := range []string{"/readyz", "/api/v1/namespaces/default"} {
		for {
			resp, err := client.Get(server + path)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s%s did not answer 200 within %s", server, path, apiserverReadyTimeout)
			}
			select {
			case err := <-errCh:
				return fmt.Errorf("kube-apiserver stopped before it was ready: %w", err)
			case <-ctx.Done():
				return errors.New("interrupted before the apiserver was ready")
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// writeKubeconfig writes the file whole, through a rename, so a reader polling for it never sees
// half of it.
func writeKubeconfig(path, server string, certs *pki) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["controlplane"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: certs.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: certs.adminPEM, ClientKeyData: certs.adminKeyPEM}
	cfg.Contexts["admin@controlplane"] = &clientcmdapi.Context{Cluster: "controlplane", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "admin@controlplane"
	tmp := path + ".tmp"
	if err := clientcmd.WriteToFile(*cfg, tmp); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return os.Rename(tmp, path)
}
