package main

import (
	"context"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the kubelet's own main registers these
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as cmd/kubelet does
	"k8s.io/kubernetes/cmd/kubelet/app"
)

// runKubelet is cmd/kubelet's main: the real kubelet of the Kubernetes release this module
// requires (version.go reports that release), run by `node` inside its private namespaces.
func runKubelet(args []string) int {
	command := app.NewKubeletCommand(context.Background())
	command.SetArgs(args)
	return cli.Run(command)
}
