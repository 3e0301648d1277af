// Command consumers runs other projects' own code, pinned to exact releases, on what topo-reporter
// writes: the schedulers and node agents that consume our files and objects. It is a separate Go
// module from the harness beside it (tests/controlplane/) because these consumers need a newer
// Kubernetes than the harness's API server; it talks to that API server as a client only.
// One subcommand per consumer, each in its own file.
//
// Kueue's controller manager is not a subcommand: it is Kueue's own main package
// (sigs.k8s.io/kueue/cmd/kueue), listed as a `tool` in go.mod and built beside this binary.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: consumers COMMAND [FLAGS]

commands:
  koordlet --dir DIR --kubeconfig FILE --node NAME   koordlet's device reporting (Koordinator v1.8.0) on a device-info directory
  volcano-hypernodes --kubeconfig FILE               Volcano's network topology discovery (HyperNodes from node labels), one JSON line per batch
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "koordlet":
		err = runKoordlet(os.Args[2:])
	case "volcano-hypernodes":
		err = runVolcanoHyperNodes(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "consumers: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "consumers %s: error: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
