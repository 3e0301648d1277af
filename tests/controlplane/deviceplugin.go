package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The double of NVIDIA's device plugin (k8s-device-plugin) that `node --devices` runs. It speaks
// the real v1beta1 Device Plugin API to the real kubelet, as NVIDIA's does: it registers
// nvidia.com/gpu on the kubelet's fixed socket, reports each GPU's UUID and NUMA node in
// ListAndWatch, answers GetPreferredAllocation and sets NVIDIA_VISIBLE_DEVICES in Allocate. It is a
// double because no GPU is here, and because the tests must inject what a real plugin does only by
// accident: a GPU turning unhealthy, the plugin stopping, or crashing and leaving its socket.
const (
	gpuResource = "nvidia.com/gpu"
	// NVIDIA's plugin serves its resource on this socket name in the kubelet's plugin directory.
	pluginSocketName = "nvidia-gpu.sock"
	// PreferredAllocationEnv names a JSON list, the command line of the preferred-allocation
	// choice (`topo-reporter best-set ... FILE`): the double appends --gpus K --available I,J
	// [--must-include I,J] --format json, with GPU indices (positions in the --devices file), and
	// reads the indices back from its "gpus". Unset: the plugin does not offer preferred
	// allocations and the kubelet's device manager chooses alone.
	PreferredAllocationEnv = "CONTROLPLANE_PREFERRED_ALLOCATION"
	kubeletSocketPoll      = 250 * time.Millisecond
	preferredTimeout       = 30 * time.Second
	registerTimeout        = 10 * time.Second
)

type gpuDevice struct {
	ID   string `json:"id"`
	NUMA int64  `json:"numa"`
}

func readDevices(path string) ([]gpuDevice, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var devices []gpuDevice
	if err := json.Unmarshal(data, &devices); err != nil {
		return nil, fmt.Errorf("%s: not a JSON list of {\"id\": UUID, \"numa\": N}: %w", path, err)
	}
	seen := map[string]bool{}
	for i, d := range devices {
		if d.ID == "" || d.NUMA < 0 {
			return nil, fmt.Errorf("%s: device %d needs a non-empty \"id\" and a \"numa\" >= 0", path, i)
		}
		if seen[d.ID] {
			return nil, fmt.Errorf("%s: device id %q is listed twice", path, d.ID)
		}
		seen[d.ID] = true
	}
	return devices, nil
}

// gpuPlugin is the double. Its control socket takes one command a line and answers "ok" or
// "error: WHY":
//
//	unhealthy ID / healthy ID   ListAndWatch reports the GPU so (the kubelet withdraws it from allocatable)
//	stop                        a clean stop: the gRPC server ends and its socket is removed
//	crash                       the gRPC server ends and its socket stays behind, as after a crash
//	start                       serve again (removing a stale socket first, as NVIDIA's plugin does) and re-register
//
// Every call the kubelet makes is appended to the events file as a JSON line.
type gpuPlugin struct {
	dir       string // the kubelet's device-plugins directory, as seen from this mount namespace
	devices   []gpuDevice
	preferred []string // the preferred-allocation command line, or nil

	mu       sync.Mutex
	unhealth map[string]bool
	changed  chan struct{} // closed and replaced on every health change
	server   *grpc.Server
	listener *net.UnixListener
	events   *os.File

	pluginapi.UnimplementedDevicePluginServer
}

func newGPUPlugin(dir string, devices []gpuDevice, eventsPath string) (*gpuPlugin, error) {
	var preferred []string
	if raw := os.Getenv(PreferredAllocationEnv); raw != "" {
		if err := json.Unmarshal([]byte(raw), &preferred); err != nil || len(preferred) == 0 {
			return nil, fmt.Errorf("%s must be a JSON list naming a command line, not %q", PreferredAllocationEnv, raw)
		}
	}
	events, err := os.OpenFile(eventsPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &gpuPlugin{
		dir: dir, devices: devices, preferred: preferred,
		unhealth: map[string]bool{}, changed: make(chan struct{}), events: events,
	}, nil
}

func (p *gpuPlugin) record(event map[string]any) {
	event["time"] = time.Now().UTC().Format(time.RFC3339Nano)
	line, _ := json.Marshal(event)
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = p.events.Write(append(line, '\n'))
}

// start serves the plugin's socket and registers with the kubelet.
func (p *gpuPlugin) start() error {
	p.mu.Lock()
	if p.server != nil {
		p.mu.Unlock()
		return errors.New("already serving")
	}
	socket := filepath.Join(p.dir, pluginSocketName)
	// A crashed plugin's socket is still there; NVIDIA's plugin removes it before serving again.
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.mu.Unlock()
		return err
	}
	listener, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		p.mu.Unlock()
		return err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	p.server, p.listener = server, listener
	p.mu.Unlock()
	go func() { _ = server.Serve(listener) }()
	if err := p.register(); err != nil {
		p.stop(true)
		return err
	}
	p.record(map[string]any{"event": "registered", "resource": gpuResource})
	return nil
}

func (p *gpuPlugin) register() error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     pluginSocketName,
		ResourceName: gpuResource,
		Options:      p.options(),
	}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet: %w", gpuResource, err)
	}
	return nil
}

// stop ends the gRPC server; with removeSocket false the socket file stays, as a crash leaves it.
func (p *gpuPlugin) stop(removeSocket bool) bool {
	p.mu.Lock()
	server, listener := p.server, p.listener
	p.server, p.listener = nil, nil
	p.mu.Unlock()
	if server == nil {
		return false
	}
	listener.SetUnlinkOnClose(removeSocket)
	server.Stop()
	_ = listener.Close()
	p.record(map[string]any{"event": map[bool]string{true: "stopped", false: "crashed"}[removeSocket]})
	return true
}

func (p *gpuPlugin) serving() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.server != nil
}

func (p *gpuPlugin) setHealth(id string, healthy bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	known := false
	for _, d := range p.devices {
		known = known || d.ID == id
	}
	if !known {
		return fmt.Errorf("no device %q", id)
	}
	if healthy {
		delete(p.unhealth, id)
	} else {
		p.unhealth[id] = true
	}
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

func (p *gpuPlugin) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := make([]*pluginapi.Device, 0, len(p.devices))
	for _, d := range p.devices {
		health := pluginapi.Healthy
		if p.unhealth[d.ID] {
			health = pluginapi.Unhealthy
		}
		list = append(list, &pluginapi.Device{
			ID: d.ID, Health: health,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: d.NUMA}}},
		})
	}
	return list, p.changed
}

func (p *gpuPlugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: p.preferred != nil}
}

func (p *gpuPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

func (p *gpuPlugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		list, changed := p.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: list}); err != nil {
			return err
		}
		unhealthy := []string{}
		for _, d := range list {
			if d.Health != pluginapi.Healthy {
				unhealthy = append(unhealthy, d.ID)
			}
		}
		p.record(map[string]any{"call": "ListAndWatch", "devices": len(list), "unhealthy": unhealthy})
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (p *gpuPlugin) index(id string) int {
	for i, d := range p.devices {
		if d.ID == id {
			return i
		}
	}
	return -1
}

func (p *gpuPlugin) indices(ids []string) (string, error) {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		i := p.index(id)
		if i < 0 {
			return "", fmt.Errorf("the kubelet named an unknown device %q", id)
		}
		out = append(out, strconv.Itoa(i))
	}
	return strings.Join(out, ","), nil
}

// choose runs the preferred-allocation command for one container's request.
func (p *gpuPlugin) choose(ctx context.Context, req *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
	available, err := p.indices(req.AvailableDeviceIDs)
	if err != nil {
		return nil, err
	}
	args := append(append([]string{}, p.preferred[1:]...),
		"--gpus", strconv.Itoa(int(req.AllocationSize)), "--available", available, "--format", "json")
	if len(req.MustIncludeDeviceIDs) > 0 {
		must, err := p.indices(req.MustIncludeDeviceIDs)
		if err != nil {
			return nil, err
		}
		args = append(args, "--must-include", must)
	}
	ctx, cancel := context.WithTimeout(ctx, preferredTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, p.preferred[0], args...).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return nil, fmt.Errorf("%s %s: %w: %s", p.preferred[0], strings.Join(args, " "), err, strings.TrimSpace(string(exit.Stderr)))
		}
		return nil, err
	}
	var chosen struct {
		GPUs []int `json:"gpus"`
	}
	if err := json.Unmarshal(out, &chosen); err != nil {
		return nil, fmt.Errorf("%s printed no JSON with \"gpus\": %w", p.preferred[0], err)
	}
	ids := make([]string, 0, len(chosen.GPUs))
	for _, i := range chosen.GPUs {
		if i < 0 || i >= len(p.devices) {
			return nil, fmt.Errorf("%s chose GPU %d, which the devices file does not list", p.preferred[0], i)
		}
		ids = append(ids, p.devices[i].ID)
	}
	return ids, nil
}

func (p *gpuPlugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		ids, err := p.choose(ctx, c)
		event := map[string]any{
			"call": "GetPreferredAllocation", "available": c.AvailableDeviceIDs,
			"mustInclude": c.MustIncludeDeviceIDs, "size": c.AllocationSize, "preferred": ids,
		}
		if err != nil {
			event["error"] = err.Error()
			p.record(event)
			return nil, err
		}
		p.record(event)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func (p *gpuPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		for _, id := range c.DevicesIds {
			if p.index(id) < 0 {
				return nil, fmt.Errorf("unknown device %q", id)
			}
		}
		p.record(map[string]any{"call": "Allocate", "devices": c.DevicesIds})
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *gpuPlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// watchKubelet re-registers when the kubelet's socket is made anew (the kubelet restarted and
// forgot its plugins), as NVIDIA's plugin does by watching the directory.
func (p *gpuPlugin) watchKubelet(ctx context.Context, logf func(string, ...any)) {
	socket := filepath.Join(p.dir, "kubelet.sock")
	// The socket's identity: its inode and its change time. A socket made anew can get the
	// inode number the old one just freed, so the inode alone misses a restart by chance.
	type identity struct {
		ino  uint64
		ctim syscall.Timespec
	}
	made := func() (identity, bool) {
		var st syscall.Stat_t
		if syscall.Stat(socket, &st) != nil {
			return identity{}, false
		}
		return identity{st.Ino, st.Ctim}, true
	}
	last, _ := made()
	// Whether a re-registration is owed: the kubelet restarted while the plugin served, and the
	// new kubelet has not taken it yet (it may not take registrations at once).
	owed := false
	ticker := time.NewTicker(kubeletSocketPoll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if now, there := made(); there && now != last {
			last = now
			owed = p.stop(true)
		}
		if !owed || p.serving() {
			owed = false
			continue
		}
		if err := p.start(); err != nil {
			logf("device plugin: re-registering after the kubelet restarted: %v", err)
			continue
		}
		owed = false
	}
}

// control serves the control socket (see gpuPlugin).
func (p *gpuPlugin) control(listener net.Listener) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			lines := bufio.NewScanner(conn)
			for lines.Scan() {
				answer := "ok"
				if err := p.command(strings.Fields(lines.Text())); err != nil {
					answer = "error: " + err.Error()
				}
				if _, err := fmt.Fprintln(conn, answer); err != nil {
					return
				}
			}
		}()
	}
}

func (p *gpuPlugin) command(words []string) error {
	if len(words) == 0 {
		return errors.New("empty command")
	}
	switch {
	case len(words) == 2 && (words[0] == "unhealthy" || words[0] == "healthy"):
		return p.setHealth(words[1], words[0] == "healthy")
	case len(words) == 1 && (words[0] == "stop" || words[0] == "crash"):
		if !p.stop(words[0] == "stop") {
			return errors.New("not serving")
		}
		return nil
	case len(words) == 1 && words[0] == "start":
		return p.start()
	}
	return fmt.Errorf("unknown command %q (unhealthy ID, healthy ID, stop, crash, start)", strings.Join(words, " "))
}
