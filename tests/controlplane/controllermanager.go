package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

// runControllerManager runs kube-controller-manager (its `app` package, options parsed from its
// own flags) with only the controllers named, by default the Job controller, which turns a Job
// into Pods, the way a cluster's does.
func runControllerManager(args []string) error {
	fs := flag.NewFlagSet("controller-manager", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig `FILE` (required)")
	controllers := fs.String("controllers", "job", "the controllers to run, kube-controller-manager's --controllers `LIST`")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: controlplane controller-manager --kubeconfig FILE [--controllers LIST] [-- KUBE-CONTROLLER-MANAGER-FLAGS...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" {
		return errors.New("--kubeconfig FILE is required")
	}
	// kube-controller-manager runs on context.Background() and never stops by itself: a cluster
	// stops it by killing it. Here a SIGTERM or SIGINT is a clean exit, whatever it is doing.
	stopped := make(chan os.Signal, 1)
	signal.Notify(stopped, syscall.SIGTERM, syscall.SIGINT)
	cmd := app.NewControllerManagerCommand()
	// One per test run: nothing to elect; no HTTPS port that a second one would collide on; the
	// controllers act with the kubeconfig's identity (no per-controller service accounts, whose
	// tokens would need the token controller).
	cmd.SetArgs(append([]string{
		"--kubeconfig=" + *kubeconfig,
		"--controllers=" + *controllers,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
	}, fs.Args()...))
	finished := make(chan error, 1)
	go func() { finished <- cmd.Execute() }()
	select {
	case <-stopped:
		return nil
	case err := <-finished:
		return err
	}
}
