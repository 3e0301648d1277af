package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// `node`: a real node for the tests. containerd (Debian's, with runc) and the real kubelet run
// together in new mount and PID namespaces: DIR/kubelet is bound onto /var/lib/kubelet, where the
// kubelet's device-plugin socket is fixed, and tmpfs lies over the other fixed paths
// (/var/log/containers, /run/containerd, /run/netns, /var/lib/cni), so nothing of the host's is
// touched; when the namespace's first process ends, the kernel kills every process left in it
// (pods, shims) and every mount goes with it. This process stays in the host's namespaces and
// owns what cannot be namespaced: the pods' bridge and its addresses, the proxy that carries the
// `kubernetes` Service's address to the apiserver, the kubelet's cgroup root, the host sysctls the
// kubelet changes, and the device plugin double.
const (
	nodeNamespaceCommand = "node-namespace"
	kubeletCommand       = "kubelet"

	// The harness apiserver's --service-cluster-ip-range and the `kubernetes` Service's address.
	serviceCIDR    = "10.96.0.0/16"
	kubernetesAddr = "10.96.0.1"
	// Pods get a /24 out of 10.244.0.0/16 (the first free one), on a bridge of their own.
	podNetPrefix = "10.244."

	nodeReadyTimeout = 3 * time.Minute
	nodeStopTimeout  = 60 * time.Second
	pollInterval     = 200 * time.Millisecond
	cleanupAttempts  = 50
)

// The host sysctls the kubelet sets at start (setupKernelTunables), and ip_forward, which the
// bridge CNI plugin may set: saved before, restored after.
var nodeSysctls = []string{
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.ip_forward",
}

// The fixed paths the kubelet, containerd and the CNI plugins use whatever their configuration
// says; in the private mount namespace the first is DIR/kubelet, the others a fresh tmpfs. /run
// whole, not /run/netns: the host's /run/netns comes and goes with `ip netns` (other tests make
// it), so no mount point of ours may be made in it.
const kubeletRoot = "/var/lib/kubelet"

var tmpfsPaths = []string{"/run", "/var/log/containers", "/var/lib/cni"}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

type nodeLayout struct {
	root, name, kubeconfig string
	cgroupRoot, bridge     string
	gateway                net.IP
	subnet                 *net.IPNet
}

func (l nodeLayout) path(parts ...string) string {
	return filepath.Join(append([]string{l.root}, parts...)...)
}

func runNode(args []string) error {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "the apiserver's kubeconfig `FILE`, the kubelet's credential (required)")
	root := fs.String("root", "", "the `DIR` that holds all of the node's state (required)")
	name := fs.String("name", "", "the `NODE` name to register (required)")
	devicesFile := fs.String("devices", "", "a JSON `FILE`, [{\"id\": GPU UUID, \"numa\": N}, ...]: run the device plugin double")
	policy := fs.String("topology-manager-policy", "none", "the kubelet's topologyManagerPolicy `P`")
	var images stringList
	fs.Var(&images, "image", "an OCI or docker `ARCHIVE` to import into containerd (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: controlplane node --kubeconfig FILE --root DIR --name NODE [--devices FILE] [--image ARCHIVE ...] [--topology-manager-policy P]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" || *root == "" || *name == "" || fs.NArg() != 0 {
		fs.Usage()
		return errors.New("--kubeconfig, --root and --name are required, and nothing else")
	}
	if err := nodePrerequisites(); err != nil {
		return err
	}
	var devices []gpuDevice
	if *devicesFile != "" {
		var err error
		if devices, err = readDevices(*devicesFile); err != nil {
			return err
		}
	}
	l := nodeLayout{name: *name, cgroupRoot: "/controlplane-node-" + *name}
	var err error
	if l.root, err = filepath.Abs(*root); err != nil {
		return err
	}
	if l.kubeconfig, err = filepath.Abs(*kubeconfig); err != nil {
		return err
	}
	for i, image := range images {
		if images[i], err = filepath.Abs(image); err != nil {
			return err
		}
		if _, err := os.Stat(images[i]); err != nil {
			return fmt.Errorf("--image: %w", err)
		}
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", l.kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	apiserver, err := url.Parse(restConfig.Host)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	n := &node{layout: l, client: client, started: time.Now()}
	stopped := make(chan os.Signal, 1)
	signal.Notify(stopped, syscall.SIGTERM, syscall.SIGINT)
	runErr := n.run(apiserver.Host, devices, images, *policy, stopped)
	if cleanErr := n.teardown(); cleanErr != nil {
		return errors.Join(runErr, fmt.Errorf("cleaning up: %w", cleanErr))
	}
	return runErr
}

func nodePrerequisites() error {
	if os.Geteuid() != 0 {
		return errors.New("the node needs root (mounts, namespaces, cgroups, a bridge)")
	}
	for _, tool := range []string{"containerd", "ctr", "runc", "ip", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install containerd, runc, iproute2 and gcc (sh tests/prereqs.sh)", tool)
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, plugin)); err != nil {
			return fmt.Errorf("no CNI plugin %s in %s: install containernetworking-plugins (sh tests/prereqs.sh)", plugin, cniBinDir)
		}
	}
	return nil
}

const cniBinDir = "/usr/lib/cni"

// node is what one `node` run made, so that teardown removes exactly that.
type node struct {
	layout  nodeLayout
	client  kubernetes.Interface
	started time.Time

	sysctls      map[string]string
	madeDirs     []string // mount points made on the host, empty there: removed at the end
	cgroups      []string
	bridgeMade   bool
	proxy        net.Listener
	namespace    *exec.Cmd
	namespaceEnd chan error
	plugin       *gpuPlugin
	control      net.Listener
	cancel       context.CancelFunc
	registered   bool
}

func (n *node) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "node %s: %.2fs "+format+"\n", append([]any{n.layout.name, time.Since(n.started).Seconds()}, args...)...)
}

func (n *node) run(apiserver string, devices []gpuDevice, images []string, policy string, stopped <-chan os.Signal) error {
	l := &n.layout
	for _, dir := range []string{l.path("logs"), l.path("kubelet", "device-plugins"), l.path("containerd"), l.path("cni", "net.d"), l.path("pod-logs")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	n.sysctls = map[string]string{}
	for _, key := range nodeSysctls {
		value, err := os.ReadFile(sysctlPath(key))
		if err == nil {
			n.sysctls[key] = strings.TrimSpace(string(value))
		}
	}
	for _, path := range append([]string{kubeletRoot}, tmpfsPaths...) {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
			n.madeDirs = append(n.madeDirs, path)
		}
	}
	if err := n.makeCgroups(); err != nil {
		return err
	}
	if err := n.makeNetwork(); err != nil {
		return err
	}
	if err := n.startProxy(apiserver); err != nil {
		return err
	}
	if err := n.writeConfigs(policy); err != nil {
		return err
	}
	pause, err := buildPauseImage(l.path("images"))
	if err != nil {
		return err
	}
	if err := n.startNamespace(append([]string{pause}, images...)); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	if err := n.waitFor("the kubelet's device-plugin socket", stopped, func() (bool, error) {
		_, err := os.Stat(l.path("kubelet", "device-plugins", "kubelet.sock"))
		return err == nil, nil
	}); err != nil {
		return err
	}
	if devices != nil {
		if err := n.startPlugin(ctx, devices); err != nil {
			return err
		}
	}
	if err := n.waitFor("the Node registered, Ready, with its GPUs allocatable", stopped, func() (bool, error) {
		return n.nodeReady(ctx, len(devices))
	}); err != nil {
		return err
	}
	if err := os.WriteFile(l.path("ready"), nil, 0o644); err != nil {
		return err
	}
	n.logf("ready (%s)", l.path("ready"))
	// SIGHUP restarts the kubelet (containerd and the pods stay), as a node's kubelet restarts.
	restart := make(chan os.Signal, 1)
	signal.Notify(restart, syscall.SIGHUP)
	for {
		select {
		case <-stopped:
			return nil
		case <-restart:
			n.logf("restarting the kubelet")
			_ = n.namespace.Process.Signal(syscall.SIGHUP)
		case err := <-n.namespaceEnd:
			n.namespace = nil
			return fmt.Errorf("containerd or the kubelet stopped: %v (logs in %s)", err, l.path("logs"))
		}
	}
}

// waitFor polls `done` until it holds, the namespace's processes stop, a signal comes or the
// bound passes.
func (n *node) waitFor(what string, stopped <-chan os.Signal, done func() (bool, error)) error {
	deadline := time.Now().Add(nodeReadyTimeout)
	for {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			n.logf("%s", what)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s within %s (logs in %s)", what, nodeReadyTimeout, n.layout.path("logs"))
		}
		select {
		case <-stopped:
			return fmt.Errorf("stopped while waiting for %s", what)
		case err := <-n.namespaceEnd:
			n.namespace = nil
			return fmt.Errorf("containerd or the kubelet stopped while waiting for %s: %v (logs in %s)", what, err, n.layout.path("logs"))
		case <-time.After(pollInterval):
		}
	}
}

func (n *node) nodeReady(ctx context.Context, gpus int) (bool, error) {
	got, err := n.client.CoreV1().Nodes().Get(ctx, n.layout.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	n.registered = true
	ready := false
	for _, c := range got.Status.Conditions {
		ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
	}
	if gpus == 0 {
		return ready, nil
	}
	allocatable := got.Status.Allocatable[corev1.ResourceName(gpuResource)]
	return ready && allocatable.Value() == int64(gpus), nil
}

func (n *node) startPlugin(ctx context.Context, devices []gpuDevice) error {
	l := n.layout
	plugin, err := newGPUPlugin(l.path("kubelet", "device-plugins"), devices, l.path("logs", "device-plugin.jsonl"))
	if err != nil {
		return err
	}
	n.plugin = plugin
	if err := plugin.start(); err != nil {
		return err
	}
	controlPath := l.path("device-plugin.control")
	_ = os.Remove(controlPath)
	if n.control, err = net.Listen("unix", controlPath); err != nil {
		return err
	}
	go plugin.control(n.control)
	go plugin.watchKubelet(ctx, n.logf)
	n.logf("device plugin double registered %d × %s; control socket %s", len(devices), gpuResource, controlPath)
	return nil
}

// makeCgroups makes the kubelet's cgroupRoot in every cgroup hierarchy: the kubelet refuses a
// root that does not exist, and its pods' cgroups all go beneath it, so one rmdir walk removes them.
func (n *node) makeCgroups() error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, mount := range mounts {
		dir := filepath.Join(mount, n.layout.cgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("making the kubelet's cgroup root: %w", err)
		}
		n.cgroups = append(n.cgroups, dir)
	}
	return nil
}

func cgroupMounts() ([]string, error) {
	file, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var mounts []string
	lines := bufio.NewScanner(file)
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				mounts = append(mounts, fields[4])
			}
		}
	}
	return mounts, lines.Err()
}

// makeNetwork makes the pods' bridge on the first 10.244.N.0/24 that no address or route of the
// host's overlaps. The bridge holds the gateway (the node's IP: the kubelet refuses loopback, and
// without one looks its name up in DNS) and the `kubernetes` Service's address, where the proxy
// listens. It has no uplink and the pods' only route is to the Service range: nothing is routed
// off the machine.
func (n *node) makeNetwork() error {
	out, err := exec.Command("ip", "-4", "-o", "route", "show", "table", "all").Output()
	if err != nil {
		return fmt.Errorf("ip route: %w", err)
	}
	used := string(out)
	if strings.Contains(used, kubernetesAddr+" ") {
		return fmt.Errorf("%s is in use on this host already (another node harness?)", kubernetesAddr)
	}
	for third := 0; third < 256; third++ {
		prefix := fmt.Sprintf("%s%d.", podNetPrefix, third)
		if !strings.Contains(used, prefix) {
			_, n.layout.subnet, _ = net.ParseCIDR(prefix + "0/24")
			n.layout.gateway = net.ParseIP(prefix + "1")
			break
		}
	}
	if n.layout.subnet == nil {
		return errors.New("no free /24 in 10.244.0.0/16 for the pods")
	}
	n.layout.bridge = "cpnode" + strconv.Itoa(os.Getpid()%100000000)
	if err := ipCommand("link", "add", n.layout.bridge, "type", "bridge"); err != nil {
		return err
	}
	n.bridgeMade = true
	for _, step := range [][]string{
		{"addr", "add", n.layout.gateway.String() + "/24", "dev", n.layout.bridge},
		{"addr", "add", kubernetesAddr + "/32", "dev", n.layout.bridge},
		{"link", "set", n.layout.bridge, "up"},
	} {
		if err := ipCommand(step...); err != nil {
			return err
		}
	}
	n.logf("bridge %s, gateway %s, %s for the kubernetes Service", n.layout.bridge, n.layout.gateway, kubernetesAddr)
	return nil
}

func ipCommand(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startProxy carries 10.96.0.1:443 to the apiserver on loopback, byte for byte (TLS passes
// through; the serving certificate names 10.96.0.1): what kube-proxy would do for the Service.
func (n *node) startProxy(apiserver string) error {
	listener, err := net.Listen("tcp", net.JoinHostPort(kubernetesAddr, "443"))
	if err != nil {
		return fmt.Errorf("listening on the kubernetes Service's address: %w", err)
	}
	n.proxy = listener
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				upstream, err := net.Dial("tcp", apiserver)
				if err != nil {
					return
				}
				defer upstream.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(upstream, conn); done <- struct{}{} }()
				go func() { _, _ = io.Copy(conn, upstream); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return nil
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

func (n *node) startNamespace(images []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	l := n.layout
	args := []string{nodeNamespaceCommand, "--root", l.root, "--name", l.name, "--kubeconfig", l.kubeconfig, "--node-ip", l.gateway.String()}
	for _, image := range images {
		args = append(args, "--image", image)
	}
	log, err := os.OpenFile(l.path("logs", "namespace.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		// Should this process die outright, the namespace's first process dies, and with it
		// every process in the namespace.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the node's namespaces: %w", err)
	}
	n.namespace = cmd
	n.namespaceEnd = make(chan error, 1)
	go func() { n.namespaceEnd <- cmd.Wait() }()
	return nil
}

// teardown removes what run made, in reverse, whatever point it reached; it goes on past errors
// and returns them all.
func (n *node) teardown() error {
	var errs []error
	l := n.layout
	if n.cancel != nil {
		n.cancel()
	}
	if n.control != nil {
		n.control.Close()
		_ = os.Remove(l.path("device-plugin.control"))
	}
	if n.plugin != nil {
		n.plugin.stop(true)
		n.plugin.events.Close()
	}
	if n.namespace != nil {
		_ = n.namespace.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.namespaceEnd:
		case <-time.After(nodeStopTimeout):
			_ = n.namespace.Process.Kill()
			<-n.namespaceEnd
			errs = append(errs, fmt.Errorf("the namespace did not stop within %s of SIGTERM: killed", nodeStopTimeout))
		}
	}
	if n.proxy != nil {
		n.proxy.Close()
	}
	if n.bridgeMade {
		errs = append(errs, removeBridge(l.bridge))
	}
	for key, value := range n.sysctls {
		now, err := os.ReadFile(sysctlPath(key))
		if err == nil && strings.TrimSpace(string(now)) != value {
			if err := os.WriteFile(sysctlPath(key), []byte(value), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restoring %s=%s: %w", key, value, err))
			}
		}
	}
	for _, dir := range n.cgroups {
		errs = append(errs, removeCgroupTree(dir))
	}
	for i := len(n.madeDirs) - 1; i >= 0; i-- {
		if err := os.Remove(n.madeDirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if n.registered {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := n.client.CoreV1().Nodes().Delete(ctx, l.name, metav1.DeleteOptions{})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting Node %s: %w", l.name, err))
		}
	}
	// Everything but the logs: the mounts of the namespace went with it, but the kernel may
	// release the last overlay a moment after the processes end.
	entries, _ := os.ReadDir(l.root)
	for _, entry := range entries {
		if entry.Name() == "logs" {
			continue
		}
		errs = append(errs, retry(func() error { return os.RemoveAll(filepath.Join(l.root, entry.Name())) }))
	}
	n.logf("stopped; what it made is removed")
	return errors.Join(errs...)
}

// removeBridge removes the pods' bridge; the pods' veth ends, which the kernel removes with their
// network namespaces a moment after those go, are removed first where they remain.
func removeBridge(bridge string) error {
	out, _ := exec.Command("ip", "-o", "link", "show", "master", bridge).Output()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 1 {
			link := strings.SplitN(strings.TrimSuffix(fields[1], ":"), "@", 2)[0]
			_ = exec.Command("ip", "link", "del", link).Run()
		}
	}
	return ipCommand("link", "del", bridge)
}

// removeCgroupTree removes a cgroup and its children, deepest first. A cgroup whose last task has
// just been killed is busy for a moment, so each rmdir is retried.
func removeCgroupTree(root string) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		dir := dirs[i]
		if err := retry(func() error {
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		}); err != nil {
			return fmt.Errorf("removing cgroup %s: %w", dir, err)
		}
	}
	return nil
}

func retry(step func() error) error {
	var err error
	for attempt := 0; attempt < cleanupAttempts; attempt++ {
		if err = step(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
