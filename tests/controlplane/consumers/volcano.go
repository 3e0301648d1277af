package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	vcclientset "volcano.sh/apis/pkg/client/clientset/versioned"
	"volcano.sh/volcano/pkg/controllers/hypernode/config"
	"volcano.sh/volcano/pkg/controllers/hypernode/discovery"
)

// volcanoConfigMap is the ConfigMap Volcano's HyperNode controller reads its discovery
// configuration from: <HELM_RELEASE_NAME, default volcano>-controller-configmap
// (pkg/controllers/hypernode/configmap_handler.go).
const volcanoConfigMap = config.DefaultReleaseName + "-controller-configmap"

// hyperNodeBatch is one discovery result, one JSON line on stdout.
type hyperNodeBatch struct {
	Source     string `json:"source"`
	HyperNodes any    `json:"hyperNodes"`
}

// runVolcanoHyperNodes runs Volcano's network topology discovery (volcano.sh/volcano v1.15.1,
// pkg/controllers/hypernode/discovery: its manager, which starts the label discoverer of
// discovery/label) wired as Volcano's HyperNode controller wires it (hypernode_controller.go
// Initialize and configmap_handler.go): Volcano's ConfigMap loader on an informer for the one
// ConfigMap, its key queued on every add, update and delete. Each batch of HyperNodes the
// discoverers hand over is printed as one JSON line, then acknowledged (ResultSynced) as the
// controller does after reconciling; the test, not this command, writes HyperNode objects.
//
// Volcano's controller itself (package hypernode) is not built: it imports Volcano's scheduler
// API, which needs volcano.sh/apis v1.15.1, and the Go module proxy refuses that version (403,
// "This module version is not available"; Volcano builds it from a staging directory). go.mod
// pins volcano.sh/apis v1.14.0, whose HyperNode API (topology/v1alpha1) the discovery code
// compiles against unchanged.
func runVolcanoHyperNodes(args []string) error {
	fs := flag.NewFlagSet("volcano-hypernodes", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig `FILE` (required)")
	namespace := fs.String("namespace", config.DefaultNamespace, "the `NAMESPACE` of "+volcanoConfigMap)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" {
		return errors.New("--kubeconfig FILE is required")
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	kubeClient, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	vcClient, err := vcclientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	informer := coreinformers.NewFilteredConfigMapInformer(kubeClient, *namespace, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		func(options *metav1.ListOptions) { options.FieldSelector = "metadata.name=" + volcanoConfigMap })
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tombstone.Obj
		}
		if cm, ok := obj.(*v1.ConfigMap); ok {
			if key, err := cache.MetaNamespaceKeyFunc(cm); err == nil {
				queue.Add(key)
			}
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	go informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return errors.New("the ConfigMap informer did not sync")
	}
	loader := config.NewConfigLoader(listersv1.NewConfigMapLister(informer.GetIndexer()), *namespace, volcanoConfigMap)
	manager := discovery.NewManager(loader, queue, kubeClient, vcClient)
	if err := manager.Start(); err != nil {
		return err
	}
	defer manager.Stop()
	fmt.Fprintln(os.Stderr, "ready")

	out := json.NewEncoder(os.Stdout)
	results := manager.ResultChannel()
	for {
		select {
		case <-ctx.Done():
			queue.ShutDown()
			return nil
		case result := <-results:
			if result.HyperNodes != nil {
				if err := out.Encode(hyperNodeBatch{Source: result.Source, HyperNodes: result.HyperNodes}); err != nil {
					return err
				}
			}
			// What the controller does once it has reconciled a batch: the discoverer waits
			// for it before its next discovery.
			manager.ResultSynced(result.Source)
		}
	}
}
