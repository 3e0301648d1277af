"""Against the real kube-apiserver, kube-scheduler and consumers that the Go harness beside these
files builds."""
