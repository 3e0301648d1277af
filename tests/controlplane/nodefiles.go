package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The pause image's one program: Kubernetes' own build/pause/linux/pause.c, copied byte for byte
// from k8s.io/kubernetes v1.37.2 (tests/controlplane/test_node.py checks it against the module).
//
//go:embed pause/pause.c
var pauseSource []byte

// pauseImage is the sandbox image containerd is told to use: built here, never pulled.
const pauseImage = "localhost/controlplane/pause:3.10"

const containerdConfig = `version = 2
root = "{{ROOT}}/containerd/root"
state = "{{ROOT}}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{{ROOT}}/containerd/containerd.sock"
[ttrpc]
  address = "{{ROOT}}/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{{ROOT}}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{PAUSE}}"
  enable_cdi = false
  stream_server_address = "127.0.0.1"
  # Where root lacks CAP_SYS_RESOURCE (these build machines), a sandbox asking for oom_score_adj
  # -998 fails in runc ("can't get final child's PID from pipe: EOF"); harmless elsewhere.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{CNIBIN}}"
    conf_dir = "{{ROOT}}/cni/net.d"
`

func (n *node) writeConfigs(policy string) error {
	l := n.layout
	containerd := strings.NewReplacer("{{ROOT}}", l.root, "{{PAUSE}}", pauseImage, "{{CNIBIN}}", cniBinDir).Replace(containerdConfig)
	// The bridge plugin with host-local IPAM; the bridge and its gateway address are made by
	// `node` (isGateway false: the plugin neither adds addresses nor turns on forwarding), and the
	// pods' one route leads to the Service range.
	cni := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "controlplane-node",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": l.bridge, "isGateway": false, "ipMasq": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"dataDir": l.path("cni", "ipam"),
				"ranges": [][]map[string]string{{{
					"subnet": l.subnet.String(), "gateway": l.gateway.String(),
					"rangeStart": nthAddress(l.subnet, 10).String(),
				}}},
				"routes": []map[string]string{{"dst": serviceCIDR, "gw": l.gateway.String()}},
			},
		}},
	}
	cniJSON, err := json.MarshalIndent(cni, "", "  ")
	if err != nil {
		return err
	}
	healthzPort, err := freePort()
	if err != nil {
		return err
	}
	kubeletPort, err := freePort()
	if err != nil {
		return err
	}
	// Every server on loopback; no iptables chains; a cgroup root of the node's own; cgroup v1
	// accepted (these hosts are hybrid); no image garbage collection of the offline images.
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
podLogsDir: %s
volumePluginDir: %s
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 2s
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 5m
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: ""
topologyManagerPolicy: %s
`, l.cgroupRoot, l.path("containerd", "containerd.sock"), l.path("containerd", "containerd.sock"),
		l.path("pod-logs"), l.path("kubelet", "volume-plugins"), kubeletPort, healthzPort, policy)
	if err := writeFiles(map[string][]byte{
		l.path("containerd", "config.toml"):          []byte(containerd),
		l.path("cni", "net.d", "10-bridge.conflist"): cniJSON,
	}); err != nil {
		return err
	}
	// 0644, as kubeadm writes it: the agent reads it as a non-root user when availability is off
	// (the chart runs it as root only for the PodResources socket), and a 0600 file is unreadable.
	return os.WriteFile(l.path("kubelet", "config.yaml"), []byte(kubelet), 0o644)
}

func nthAddress(subnet *net.IPNet, n byte) net.IP {
	ip := append(net.IP{}, subnet.IP.To4()...)
	ip[3] += n
	return ip
}

// buildPauseImage compiles pause.c statically and packs it as a docker archive (one layer) in
// dir, for `ctr images import`; returns the archive's path.
func buildPauseImage(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	source := filepath.Join(dir, "pause.c")
	binary := filepath.Join(dir, "pause")
	if err := os.WriteFile(source, pauseSource, 0o644); err != nil {
		return "", err
	}
	if out, err := exec.Command("gcc", "-Os", "-static", "-DVERSION=v3.10-controlplane", "-o", binary, source).CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc pause.c (gcc and libc6-dev are needed): %v: %s", err, out)
	}
	program, err := os.ReadFile(binary)
	if err != nil {
		return "", err
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(program)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}
	if _, err := tw.Write(program); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	digest := sha256.Sum256(layer.Bytes())
	diffID := "sha256:" + hex.EncodeToString(digest[:])
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/pause"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return "", err
	}
	configDigest := sha256.Sum256(config)
	configName := hex.EncodeToString(configDigest[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{pauseImage}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return "", err
	}
	archive := filepath.Join(dir, "pause.tar")
	var out bytes.Buffer
	aw := tar.NewWriter(&out)
	for _, file := range []struct {
		name string
		data []byte
	}{{"layer.tar", layer.Bytes()}, {configName, config}, {"manifest.json", manifest}} {
		if err := aw.WriteHeader(&tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
			return "", err
		}
		if _, err := aw.Write(file.data); err != nil {
			return "", err
		}
	}
	if err := aw.Close(); err != nil {
		return "", err
	}
	return archive, os.WriteFile(archive, out.Bytes(), 0o644)
}
