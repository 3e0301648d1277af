package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"sigs.k8s.io/yaml"
)

// maxConfigBytes bounds the KubeSchedulerConfiguration read: real ones are a few KiB.
const maxConfigBytes = 1 << 20

func runScheduler(args []string) error {
	fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
	config := fs.String("config", "", "the KubeSchedulerConfiguration `FILE` (required)")
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig `FILE`; replaces the configuration's clientConnection.kubeconfig")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: controlplane scheduler --config FILE [--kubeconfig FILE] [-- KUBE-SCHEDULER-FLAGS...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *config == "" {
		return errors.New("--config FILE is required: a KubeSchedulerConfiguration")
	}
	configPath := *config
	if *kubeconfig != "" {
		// kube-scheduler ignores its own --kubeconfig flag whenever --config is given, so the
		// kubeconfig goes into a copy of the configuration instead.
		dir, err := os.MkdirTemp("", "controlplane-scheduler-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if configPath, err = withKubeconfig(*config, *kubeconfig, dir); err != nil {
			return err
		}
	}
	// kube-scheduler without leader election reports its SIGTERM stop as an error ("finished
	// without leader elect"); a requested stop is a clean exit here.
	stopped := make(chan os.Signal, 1)
	signal.Notify(stopped, syscall.SIGTERM, syscall.SIGINT)
	cmd := app.NewSchedulerCommand()
	// One scheduler per test: no leader election; no HTTPS port that a second one would collide on.
	cmd.SetArgs(append([]string{"--config=" + configPath, "--leader-elect=false", "--secure-port=0"}, fs.Args()...))
	err := cmd.Execute()
	select {
	case <-stopped:
		return nil
	default:
		return err
	}
}

func withKubeconfig(configFile, kubeconfig, dir string) (string, error) {
	info, err := os.Stat(configFile)
	if err != nil {
		return "", err
	}
	if info.Size() > maxConfigBytes {
		return "", fmt.Errorf("%s: larger than %d bytes", configFile, maxConfigBytes)
	}
	data, err := os.ReadFile(configFile)
	if err != nil {
		return "", err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", configFile, err)
	}
	if doc == nil {
		return "", fmt.Errorf("%s: empty, expected a KubeSchedulerConfiguration", configFile)
	}
	kubeconfigPath, err := filepath.Abs(kubeconfig)
	if err != nil {
		return "", err
	}
	conn, _ := doc["clientConnection"].(map[string]any)
	if conn == nil {
		conn = map[string]any{}
	}
	conn["kubeconfig"] = kubeconfigPath
	doc["clientConnection"] = conn
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "scheduler.yaml")
	return path, os.WriteFile(path, out, 0o600)
}
