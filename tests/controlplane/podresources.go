package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

const (
	// maxStateBytes bounds the state file: a node's devices and pods fit in a few KiB.
	maxStateBytes = 16 << 20
	stopTimeout   = 10 * time.Second
)

// The state file: what the device plugins registered and which pods hold which devices, as the
// kubelet's device manager would know it, and which devices DRA drivers prepared for each
// container's ResourceClaims, as its DRA manager would.
type stateFile struct {
	Devices []stateDevice `json:"devices"`
	Pods    []statePod    `json:"pods"`
}

type stateDevice struct {
	Resource string  `json:"resource"`
	ID       string  `json:"id"`
	NUMA     []int64 `json:"numa"`
	Healthy  bool    `json:"healthy"`
}

type statePod struct {
	Namespace  string           `json:"namespace"`
	Name       string           `json:"name"`
	Containers []stateContainer `json:"containers"`
}

type stateContainer struct {
	Name    string             `json:"name"`
	Devices []stateAssignments `json:"devices"`
	Claims  []stateClaim       `json:"claims"`
}

// stateClaim is one ResourceClaim of a container with the devices its drivers prepared.
type stateClaim struct {
	Namespace string             `json:"namespace"`
	Name      string             `json:"name"`
	Devices   []stateClaimDevice `json:"devices"`
}

type stateClaimDevice struct {
	Driver string   `json:"driver"`
	Pool   string   `json:"pool"`
	Device string   `json:"device"`
	CDI    []string `json:"cdi"`
}

type stateAssignments struct {
	Resource string   `json:"resource"`
	IDs      []string `json:"ids"`
}

// snapshot is one reading of the state file, in the shapes the providers hand out.
type snapshot struct {
	pods        []*v1.Pod
	byName      map[string]*v1.Pod
	assigned    map[string]map[string][]*podresourcesapi.ContainerDevices // pod UID -> container -> devices
	claims      map[string]map[string][]*podresourcesapi.DynamicResource  // pod UID -> container -> claims
	allocatable []*podresourcesapi.ContainerDevices
}

type fileID struct {
	mtime time.Time
	size  int64
	inode uint64
}

// state re-reads the file whenever it changes. It refreshes only on the first provider call of
// each RPC (the pod or allocatable lookup), so one answer never mixes two versions of the file.
type state struct {
	path string
	mu   sync.Mutex
	seen fileID
	snap *snapshot
}

func podUID(namespace, name string) string { return namespace + "/" + name }

// deviceEntries is the kubelet's own conversion (containerDevicesFromResourceDeviceInstances in
// pkg/kubelet/cm): one entry per device and NUMA node, no topology when the plugin gave none.
func deviceEntries(resource, id string, numa []int64) []*podresourcesapi.ContainerDevices {
	if len(numa) == 0 {
		return []*podresourcesapi.ContainerDevices{{ResourceName: resource, DeviceIds: []string{id}}}
	}
	out := make([]*podresourcesapi.ContainerDevices, 0, len(numa))
	for _, node := range numa {
		out = append(out, &podresourcesapi.ContainerDevices{
			ResourceName: resource,
			DeviceIds:    []string{id},
			Topology:     &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: node}}},
		})
	}
	return out
}

func parseState(data []byte) (*snapshot, error) {
	var f stateFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	numa := map[string][]int64{}
	snap := &snapshot{
		byName:   map[string]*v1.Pod{},
		assigned: map[string]map[string][]*podresourcesapi.ContainerDevices{},
		claims:   map[string]map[string][]*podresourcesapi.DynamicResource{},
	}
	for _, d := range f.Devices {
		if d.Resource == "" || d.ID == "" {
			return nil, errors.New("a device needs a resource and an id")
		}
		key := d.Resource + "\x00" + d.ID
		if _, dup := numa[key]; dup {
			return nil, fmt.Errorf("device %s %s listed twice", d.Resource, d.ID)
		}
		numa[key] = d.NUMA
		if d.Healthy {
			// The device manager's GetAllocatableDevices filters on health.
			snap.allocatable = append(snap.allocatable, deviceEntries(d.Resource, d.ID, d.NUMA)...)
		}
	}
	for _, p := range f.Pods {
		if p.Namespace == "" || p.Name == "" {
			return nil, errors.New("a pod needs a namespace and a name")
		}
		uid := podUID(p.Namespace, p.Name)
		if _, dup := snap.byName[uid]; dup {
			return nil, fmt.Errorf("pod %s listed twice", uid)
		}
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: types.UID(uid)},
			Status:     v1.PodStatus{Phase: v1.PodRunning},
		}
		containers := map[string][]*podresourcesapi.ContainerDevices{}
		claims := map[string][]*podresourcesapi.DynamicResource{}
		for _, c := range p.Containers {
			if c.Name == "" {
				return nil, fmt.Errorf("pod %s: a container needs a name", uid)
			}
			pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: c.Name})
			var devices []*podresourcesapi.ContainerDevices
			for _, a := range c.Devices {
				for _, id := range a.IDs {
					// A device the plugin never listed has no known topology, as in the kubelet.
					devices = append(devices, deviceEntries(a.Resource, id, numa[a.Resource+"\x00"+id])...)
				}
			}
			containers[c.Name] = devices
			claims[c.Name] = dynamicResources(c.Claims)
		}
		snap.pods = append(snap.pods, pod)
		snap.byName[uid] = pod
		snap.assigned[uid] = containers
		snap.claims[uid] = claims
	}
	return snap, nil
}

// dynamicResources is the kubelet's own conversion of a container's prepared claims
// (containerManagerImpl.GetDynamicResources in pkg/kubelet/cm), one ClaimResource per device.
func dynamicResources(claims []stateClaim) []*podresourcesapi.DynamicResource {
	var out []*podresourcesapi.DynamicResource
	for _, c := range claims {
		resource := &podresourcesapi.DynamicResource{ClaimName: c.Name, ClaimNamespace: c.Namespace}
		for _, d := range c.Devices {
			var cdi []*podresourcesapi.CDIDevice
			for _, name := range d.CDI {
				cdi = append(cdi, &podresourcesapi.CDIDevice{Name: name})
			}
			resource.ClaimResources = append(resource.ClaimResources, &podresourcesapi.ClaimResource{
				CdiDevices: cdi, DriverName: d.Driver, PoolName: d.Pool, DeviceName: d.Device,
			})
		}
		out = append(out, resource)
	}
	return out
}

// refresh re-reads the file if it changed. A file that cannot be read or parsed (a writer caught
// half-way) leaves the last good state in place.
func (s *state) refresh() *snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	info, err := os.Stat(s.path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podresources: %v; serving the last good state\n", err)
		return s.snap
	}
	id := fileID{mtime: info.ModTime(), size: info.Size()}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		id.inode = st.Ino
	}
	if id == s.seen && s.snap != nil {
		return s.snap
	}
	if info.Size() > maxStateBytes {
		fmt.Fprintf(os.Stderr, "podresources: %s is larger than %d bytes; serving the last good state\n", s.path, maxStateBytes)
		return s.snap
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podresources: %v; serving the last good state\n", err)
		return s.snap
	}
	snap, err := parseState(data)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podresources: %s: %v; serving the last good state\n", s.path, err)
		return s.snap
	}
	s.seen, s.snap = id, snap
	return snap
}

func (s *state) current() *snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

// Providers: the interfaces the kubelet's podresources server reads through.

type podsProvider struct{ s *state }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.s.refresh().pods }
func (p podsProvider) GetPods() []*v1.Pod       { return p.s.refresh().pods }
func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	pod, ok := p.s.refresh().byName[podUID(namespace, name)]
	return pod, ok
}

type devicesProvider struct{ s *state }

// UpdateAllocatedDevices frees devices of terminated pods; the file lists running pods only.
func (devicesProvider) UpdateAllocatedDevices(klog.Logger) {}
func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return d.s.current().assigned[podUID][containerName]
}
func (d devicesProvider) GetAllocatableDevices(klog.Logger) []*podresourcesapi.ContainerDevices {
	return d.s.refresh().allocatable
}

type dynamicResourcesProvider struct{ s *state }

func (d dynamicResourcesProvider) GetDynamicResources(_ klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return d.s.current().claims[string(pod.UID)][container.Name]
}

// No CPU manager or memory manager on this node: their answers are empty, as on a kubelet with
// the `none` policies.
type emptyProviders struct{}

func (emptyProviders) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (emptyProviders) GetPodCPUs(string) []int64              { return nil }
func (emptyProviders) GetAllocatableCPUs() []int64            { return nil }
func (emptyProviders) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (emptyProviders) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory {
	return nil
}
func (emptyProviders) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory {
	return nil
}

func runPodResources(args []string) error {
	fs := flag.NewFlagSet("podresources", flag.ContinueOnError)
	socket := fs.String("socket", "", "serve on this unix socket `PATH` (required)")
	statePath := fs.String("state", "", "the devices and pods, a JSON `FILE` re-read when it changes (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *socket == "" || *statePath == "" || fs.NArg() != 0 {
		return errors.New("usage: controlplane podresources --socket PATH --state FILE")
	}
	st := &state{path: *statePath}
	if st.refresh() == nil {
		return fmt.Errorf("%s: no readable state to start from", *statePath)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	empty := emptyProviders{}
	providers := podresources.PodResourcesProviders{
		Pods: podsProvider{st}, Devices: devicesProvider{st},
		Cpus: empty, Memory: empty, DynamicResources: dynamicResourcesProvider{st},
	}
	// As the kubelet's ListenAndServePodResources builds it, rate limit included; only the
	// listener is ours, so that readiness can be announced and the socket removed on exit.
	server := grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", podresources.DefaultQPS, podresources.DefaultBurstTokens))
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))

	if err := os.Remove(*socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the stale socket: %w", err)
	}
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		return err
	}
	defer os.Remove(*socket)
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	fmt.Println("ready")

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { server.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopTimeout):
		server.Stop()
	}
	return nil
}
