// Command controlplane hosts Kubernetes' own server code for topo-reporter's tests: the real
// kube-apiserver on an embedded etcd, the real kube-scheduler and kube-controller-manager, the
// real kubelet on containerd (with a double of NVIDIA's device plugin), and the kubelet's
// PodResources gRPC server. The product is Python; this module exists only so the tests meet the
// real thing.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: controlplane COMMAND [FLAGS]

commands:
  apiserver --kubeconfig FILE                  kube-apiserver on an embedded etcd; writes an admin kubeconfig once /readyz answers
  scheduler --config FILE [--kubeconfig FILE]  kube-scheduler from a KubeSchedulerConfiguration
  podresources --socket PATH --state FILE      the kubelet's PodResources v1 server, fed from a JSON file
  controller-manager --kubeconfig FILE         kube-controller-manager with the named controllers (default: job)
  node --kubeconfig FILE --root DIR --name NODE [--devices FILE] [--image ARCHIVE ...] [--topology-manager-policy P]
                                               the real kubelet on containerd, registered as NODE, all state under DIR;
                                               with --devices, a double of NVIDIA's device plugin (nvidia.com/gpu)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "apiserver":
		err = runAPIServer(os.Args[2:])
	case "scheduler":
		err = runScheduler(os.Args[2:])
	case "podresources":
		err = runPodResources(os.Args[2:])
	case "controller-manager":
		err = runControllerManager(os.Args[2:])
	case "node":
		err = runNode(os.Args[2:])
	case nodeNamespaceCommand:
		// Internal: `node` runs itself as this, in new mount and PID namespaces.
		err = runNodeNamespace(os.Args[2:])
	case kubeletCommand:
		// Internal: the kubelet, started by nodeNamespaceCommand.
		os.Exit(runKubelet(os.Args[2:]))
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "controlplane: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "controlplane %s: error: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
