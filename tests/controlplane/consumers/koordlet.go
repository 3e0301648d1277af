package main

// koordlet: Koordinator v1.8.0's own node agent code on a device-info directory, as koordlet runs
// it with the Accelerators feature gate on:
//   1. its XPU reader (`xpu.GetXPUDevice`, what the XPU device collector's Infos() calls) reads the
//      directory, and the result goes into koordlet's metric cache under its device type, as the
//      node resource collector stores it;
//   2. its states informer, with its node informer only, runs `reportDevice` against the API
//      server: it builds the Device (devices, labels, the gpu-partitions annotation) and creates
//      it. Whatever it sends is recorded on the way, so a refused Device is shown too;
//   3. the stored Device is read back and its partition table decoded with
//      `apiext.GetGPUPartitionTable` and `apiext.GetGPUPartitionPolicy`, the functions
//      koord-scheduler's deviceshare plugin reads them with.
// It prints one JSON report on stdout; the Python tests judge it against the topology.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	topologyclientset "github.com/k8stopologyawareschedwg/noderesourcetopology-api/pkg/generated/clientset/versioned"
	apiext "github.com/koordinator-sh/koordinator/apis/extension"
	schedulingv1alpha1 "github.com/koordinator-sh/koordinator/apis/scheduling/v1alpha1"
	koordclientset "github.com/koordinator-sh/koordinator/pkg/client/clientset/versioned"
	schedclient "github.com/koordinator-sh/koordinator/pkg/client/clientset/versioned/typed/scheduling/v1alpha1"
	"github.com/koordinator-sh/koordinator/pkg/features"
	"github.com/koordinator-sh/koordinator/pkg/koordlet/metriccache"
	"github.com/koordinator-sh/koordinator/pkg/koordlet/metricsadvisor/devices/xpu"
	"github.com/koordinator-sh/koordinator/pkg/koordlet/statesinformer/impl"
	koordletutil "github.com/koordinator-sh/koordinator/pkg/koordlet/util"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// nodeInformer is the key of koordlet's node informer in impl.DefaultPluginRegistry, which the
// package documents as overwritable: reportDevice needs the Node and nothing else.
const nodeInformer impl.PluginName = "nodeInformer"

// koordletReport is what the tests read.
type koordletReport struct {
	// Read is what koordlet's XPU reader returned for the directory.
	Read koordletutil.XPUDevices `json:"read"`
	// Sent is the Device reportDevice sent to the API server; Verb is "create" or "update".
	Verb string                     `json:"verb"`
	Sent *schedulingv1alpha1.Device `json:"sent"`
	// Refused is the API server's answer when it refused the Device; empty when it took it.
	Refused string `json:"refused"`
	// LabelErrors and AnnotationErrors: the API server's own metadata validation of Sent.
	LabelErrors      []string `json:"labelErrors"`
	AnnotationErrors []string `json:"annotationErrors"`
	// Stored is the Device as the API server holds it, read back.
	Stored *schedulingv1alpha1.Device `json:"stored"`
	// PartitionTable and PartitionPolicy: the stored Device as koord-scheduler decodes it.
	PartitionTable  apiext.GPUPartitionTable  `json:"partitionTable"`
	PartitionPolicy apiext.GPUPartitionPolicy `json:"partitionPolicy"`
}

func runKoordlet(args []string) error {
	fs := flag.NewFlagSet("koordlet", flag.ContinueOnError)
	dir := fs.String("dir", "", "koordlet's xpu-device-infos `DIR` (required)")
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig `FILE` of the API server (required)")
	node := fs.String("node", "", "the Node `NAME` koordlet runs on (required; it must exist)")
	timeout := fs.Duration("timeout", time.Minute, "how long to wait for koordlet's Device write")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: consumers koordlet --dir DIR --kubeconfig FILE --node NAME [--timeout D]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *kubeconfig == "" || *node == "" {
		return errors.New("--dir, --kubeconfig and --node are required")
	}
	if err := features.DefaultMutableKoordletFeatureGate.Set(string(features.Accelerators) + "=true"); err != nil {
		return err
	}

	read, err := xpu.GetXPUDevice(*dir)
	if err != nil {
		return fmt.Errorf("koordlet's XPU reader refused %s: %w", *dir, err)
	}
	devices, _ := read.(koordletutil.XPUDevices)
	if len(devices) == 0 {
		return fmt.Errorf("koordlet's XPU reader found no device in %s", *dir)
	}
	tsdb, err := os.MkdirTemp("", "consumers-koordlet-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tsdb)
	cache, err := metricCache(tsdb)
	if err != nil {
		return err
	}
	cache.Set(read.Type(), read)

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	koord, err := koordclientset.NewForConfig(config)
	if err != nil {
		return err
	}
	topology, err := topologyclientset.NewForConfig(config)
	if err != nil {
		return err
	}

	for name := range impl.DefaultPluginRegistry {
		if name != nodeInformer {
			delete(impl.DefaultPluginRegistry, name)
		}
	}
	writes := make(chan deviceWrite, 8)
	informerConfig := impl.NewDefaultConfig()
	// One report is all the test reads; a second one would only compare and skip.
	informerConfig.NodeTopologySyncInterval = time.Hour
	scheduling := recordingScheduling{SchedulingV1alpha1Interface: koord.SchedulingV1alpha1(), writes: writes}
	informer := impl.NewStatesInformer(informerConfig, kube, koord, topology, cache, *node, scheduling, nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		if err := informer.Run(stop); err != nil {
			fmt.Fprintf(os.Stderr, "consumers koordlet: states informer: %v\n", err)
		}
	}()

	var write deviceWrite
	select {
	case write = <-writes:
	case <-time.After(*timeout):
		return fmt.Errorf("koordlet wrote no Device for node %s within %s (see its log above)", *node, *timeout)
	}
	report := koordletReport{Read: devices, Verb: write.verb, Sent: write.device}
	for _, e := range metav1validation.ValidateLabels(write.device.Labels, field.NewPath("metadata", "labels")) {
		report.LabelErrors = append(report.LabelErrors, e.Error())
	}
	for _, e := range apivalidation.ValidateAnnotations(write.device.Annotations, field.NewPath("metadata", "annotations")) {
		report.AnnotationErrors = append(report.AnnotationErrors, e.Error())
	}
	if write.err != nil {
		report.Refused = write.err.Error()
	} else {
		stored, err := koord.SchedulingV1alpha1().Devices().Get(context.Background(), *node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading back Device %s: %w", *node, err)
		}
		report.Stored = stored
		if report.PartitionTable, err = apiext.GetGPUPartitionTable(stored); err != nil {
			return fmt.Errorf("koord-scheduler cannot decode the partition table of Device %s: %w", *node, err)
		}
		report.PartitionPolicy = apiext.GetGPUPartitionPolicy(stored)
	}
	out, err := json.Marshal(report)
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

// metricCache is koordlet's own metric cache, its TSDB in `dir` (reportDevice reads only the
// cache's key-value store, but the cache comes with both).
func metricCache(dir string) (metriccache.MetricCache, error) {
	config := metriccache.NewDefaultConfig()
	config.TSDBPath = dir
	config.TSDBEnablePromMetrics = false
	return metriccache.NewMetricCache(config)
}

// deviceWrite is one Device write reportDevice made, with the API server's answer.
type deviceWrite struct {
	verb   string
	device *schedulingv1alpha1.Device
	err    error
}

// recordingScheduling is the real scheduling client; its Devices() records each Device written
// through it (after the real call), so the report can show what koordlet built even when the API
// server refused it.
type recordingScheduling struct {
	schedclient.SchedulingV1alpha1Interface
	writes chan<- deviceWrite
}

func (r recordingScheduling) Devices() schedclient.DeviceInterface {
	return recordingDevices{DeviceInterface: r.SchedulingV1alpha1Interface.Devices(), writes: r.writes}
}

type recordingDevices struct {
	schedclient.DeviceInterface
	writes chan<- deviceWrite
}

func (d recordingDevices) record(verb string, sent *schedulingv1alpha1.Device, err error) {
	select {
	case d.writes <- deviceWrite{verb: verb, device: sent, err: err}:
	default: // the test reads the first write; later ones never block koordlet's loop
	}
}

func (d recordingDevices) Create(ctx context.Context, device *schedulingv1alpha1.Device, opts metav1.CreateOptions) (*schedulingv1alpha1.Device, error) {
	sent := device.DeepCopy()
	created, err := d.DeviceInterface.Create(ctx, device, opts)
	d.record("create", sent, err)
	return created, err
}

func (d recordingDevices) Update(ctx context.Context, device *schedulingv1alpha1.Device, opts metav1.UpdateOptions) (*schedulingv1alpha1.Device, error) {
	sent := device.DeepCopy()
	updated, err := d.DeviceInterface.Update(ctx, device, opts)
	d.record("update", sent, err)
	return updated, err
}
