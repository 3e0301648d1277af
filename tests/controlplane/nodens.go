package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

const (
	containerdStartTimeout = 60 * time.Second
	kubeletStopTimeout     = 20 * time.Second
	containerdStopTimeout  = 10 * time.Second
)

// runNodeNamespace is the first process of the node's mount and PID namespaces (started by
// `node`). It makes the private mounts, starts containerd, imports the images, starts the
// kubelet (again on SIGHUP, which `node` passes on), and on SIGTERM stops the kubelet, then
// containerd; when it returns, the kernel kills
// whatever is left in the PID namespace (the pods and their shims), and the mounts go with the
// mount namespace. As PID 1 it also reaps the shims that containerd's daemonizing leaves to it.
func runNodeNamespace(args []string) error {
	fs := flag.NewFlagSet(nodeNamespaceCommand, flag.ContinueOnError)
	root := fs.String("root", "", "")
	name := fs.String("name", "", "")
	kubeconfig := fs.String("kubeconfig", "", "")
	nodeIP := fs.String("node-ip", "", "")
	var images stringList
	fs.Var(&images, "image", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Getpid() != 1 {
		return errors.New("runs only as the first process of the namespaces `node` makes")
	}
	stopped := make(chan os.Signal, 1)
	signal.Notify(stopped, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)

	if err := privateMounts(*root); err != nil {
		return err
	}
	logs := filepath.Join(*root, "logs")
	socket := filepath.Join(*root, "containerd", "containerd.sock")
	containerd, err := startLogged(filepath.Join(logs, "containerd.log"), "containerd", "--config", filepath.Join(*root, "containerd", "config.toml"))
	if err != nil {
		return err
	}
	exits := map[int]chan syscall.WaitStatus{containerd.Pid: make(chan syscall.WaitStatus, 1)}
	reap := func() {
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if err != nil || pid <= 0 {
				return
			}
			if ch, ok := exits[pid]; ok {
				ch <- status
			}
		}
	}
	stop := func(p *os.Process, timeout time.Duration) {
		_ = p.Signal(syscall.SIGTERM)
		deadline := time.After(timeout)
		for {
			select {
			case <-exits[p.Pid]:
				return
			case <-children:
				reap()
			case <-deadline:
				_ = p.Kill()
				return
			}
		}
	}
	defer stop(containerd, containerdStopTimeout)

	deadline := time.Now().Add(containerdStartTimeout)
	for {
		if conn, err := net.Dial("unix", socket); err == nil {
			conn.Close()
			break
		}
		reap()
		select {
		case <-exits[containerd.Pid]:
			return fmt.Errorf("containerd exited at start (see %s)", filepath.Join(logs, "containerd.log"))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not answer on %s within %s", socket, containerdStartTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, image := range images {
		// The kubelet's images come from these archives only (pods say imagePullPolicy: Never).
		out, err := exec.Command("ctr", "-a", socket, "-n", "k8s.io", "images", "import", image).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %v: %s", image, err, out)
		}
		fmt.Printf("imported %s: %s", image, out)
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	startKubelet := func() (*os.Process, error) {
		p, err := startLogged(filepath.Join(logs, "kubelet.log"), self, kubeletCommand,
			"--config="+filepath.Join(*root, "kubelet", "config.yaml"),
			"--kubeconfig="+*kubeconfig,
			"--hostname-override="+*name,
			"--node-ip="+*nodeIP,
			"--v=1")
		if err == nil {
			exits[p.Pid] = make(chan syscall.WaitStatus, 1)
		}
		return p, err
	}
	kubelet, err := startKubelet()
	if err != nil {
		return err
	}
	defer func() { stop(kubelet, kubeletStopTimeout) }()
	restart := make(chan os.Signal, 1)
	signal.Notify(restart, syscall.SIGHUP)
	for {
		select {
		case <-stopped:
			return nil
		case <-restart:
			stop(kubelet, kubeletStopTimeout)
			delete(exits, kubelet.Pid)
			if kubelet, err = startKubelet(); err != nil {
				return fmt.Errorf("restarting the kubelet: %w", err)
			}
			fmt.Println("kubelet restarted")
		case <-children:
			reap()
		case status := <-exits[kubelet.Pid]:
			return fmt.Errorf("the kubelet exited (%v; see %s)", status, filepath.Join(logs, "kubelet.log"))
		case status := <-exits[containerd.Pid]:
			return fmt.Errorf("containerd exited (%v; see %s)", status, filepath.Join(logs, "containerd.log"))
		}
	}
}

// privateMounts detaches this mount namespace from the host's, mounts /proc for the new PID
// namespace, binds root/kubelet onto /var/lib/kubelet and puts tmpfs over the other fixed paths
// (`node` made any mount point the host lacked).
func privateMounts(root string) error {
	steps := []struct {
		source, target, fstype string
		flags                  uintptr
	}{
		{"", "/", "", syscall.MS_REC | syscall.MS_PRIVATE},
		{"proc", "/proc", "proc", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC},
		{filepath.Join(root, "kubelet"), kubeletRoot, "", syscall.MS_BIND},
	}
	for _, path := range tmpfsPaths {
		steps = append(steps, struct {
			source, target, fstype string
			flags                  uintptr
		}{"tmpfs", path, "tmpfs", syscall.MS_NOSUID | syscall.MS_NODEV})
	}
	for _, s := range steps {
		if err := syscall.Mount(s.source, s.target, s.fstype, s.flags, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %w", s.source, s.target, err)
		}
	}
	return nil
}

func startLogged(logPath, program string, args ...string) (*os.Process, error) {
	path, err := exec.LookPath(program)
	if err != nil {
		return nil, err
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	return os.StartProcess(path, append([]string{path}, args...), &os.ProcAttr{
		Files: []*os.File{devnull, log, log},
		Env:   os.Environ(),
	})
}
