// Command consumers hosts the code of the schedulers and controllers that read topo-reporter's
// labels and objects, each at its pinned release, for the tests: they meet the consumer's own code,
// not a copy of its rules. One subcommand per consumer, one file each. This module sits beside the
// harness (../) because these consumers are built on a newer Kubernetes (1.35) than the harness's
// apiserver; client-go talks to it across that skew as it does in a real cluster.
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
  volcano-hypernodes --kubeconfig FILE   Volcano's network topology discovery (HyperNodes from node labels), one JSON line per batch
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
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
