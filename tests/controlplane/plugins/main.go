// Command plugins hosts the schedulers of other projects whose latest releases build only against
// Kubernetes 1.34, for topo-reporter's tests against the harness's 1.37 control plane:
// scheduler-plugins v0.34.7's NodeResourceTopologyMatch in the kube-scheduler of 1.34.9 (the
// plugin's framework types moved to k8s.io/kube-scheduler in 1.35), and, as a `tool` of this
// module, YuniKorn v1.8.0's scheduler.
//
//	plugins --config FILE [KUBE-SCHEDULER-FLAGS...]
//
// runs kube-scheduler with NodeResourceTopologyMatch registered out of tree and its configuration
// types in the scheme, as scheduler-plugins' own cmd/scheduler does; a configuration that does not
// enable it runs the stock scheduler. The configuration names its kubeconfig
// (clientConnection.kubeconfig): kube-scheduler ignores its own --kubeconfig flag whenever
// --config is given.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/noderesourcetopology"
)

func main() {
	// kube-scheduler without leader election reports its SIGTERM stop as an error ("finished
	// without leader elect"); a requested stop is a clean exit here.
	stopped := make(chan os.Signal, 1)
	signal.Notify(stopped, syscall.SIGTERM, syscall.SIGINT)
	cmd := app.NewSchedulerCommand(app.WithPlugin(noderesourcetopology.Name, noderesourcetopology.New))
	// One scheduler per test: no leader election; no HTTPS port that a second one would collide on.
	cmd.SetArgs(append([]string{"--leader-elect=false", "--secure-port=0"}, os.Args[1:]...))
	err := cmd.Execute()
	select {
	case <-stopped:
		return
	default:
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "plugins: error: %v\n", err)
		os.Exit(1)
	}
}
