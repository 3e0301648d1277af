// Command check runs NVIDIA's go-gpuallocator best-effort policy (the release NVIDIA's
// k8s-device-plugin pins) on allocation requests read as JSON, so that topo-reporter's tests
// compare their re-implementation (reporter/gpuallocator.py) with the real code, answer for
// answer.
//
// tests/gpuallocator.py assembles it, at test time, into a module of its own named like
// go-gpuallocator's (its internal/links package is importable only from inside): the policy,
// gpuallocator/besteffort_policy.go, copied unchanged from the Go module cache; internal/links
// with the P2PLinkType declarations cut out of go-gpuallocator's own internal/links/device.go;
// device.go and allocator.go of this folder for the types the policy reads; this file as
// cmd/check. go-gpuallocator's other files reach NVML through go-nvml's cgo bindings, which Go
// 1.26's cgo does not compile ("incompatible type for argument 1 of
// 'nvmlDeviceGetAPIRestriction'", go-nvml v0.12.9-0 and v0.13.3-1 alike), and decide nothing
// the policy does. The folder is testdata so that the harness module never builds it.
//
// stdin: a JSON array of requests, each
//
//	{"gpus": 8, "links": [[from, to, type], ...], "available": [...], "required": [...], "size": k}
//
// where `type` is go-gpuallocator's P2PLinkType number (1 P2PLinkCrossCPU ... 6 P2PLinkSameBoard,
// 7 SingleNVLINKLink ... 24 EighteenNVLINKLinks) and `available` is in the order the policy is to
// see it (the order decides ties). stdout: a JSON array with, per request, the GPU indexes the
// policy returned, in its order, -1 where it returned an empty (padding) place.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/NVIDIA/go-gpuallocator/internal/links"
)

type request struct {
	GPUs      int      `json:"gpus"`
	Links     [][3]int `json:"links"`
	Available []int    `json:"available"`
	Required  []int    `json:"required"`
	Size      int      `json:"size"`
}

func devices(r request) ([]*gpuallocator.Device, error) {
	out := make([]*gpuallocator.Device, r.GPUs)
	for i := range out {
		out[i] = &gpuallocator.Device{Index: i, Links: map[int][]gpuallocator.P2PLink{}}
	}
	for _, l := range r.Links {
		from, to, kind := l[0], l[1], l[2]
		if from < 0 || from >= r.GPUs || to < 0 || to >= r.GPUs || kind < 1 || kind > 24 {
			return nil, fmt.Errorf("link %v is not [from, to, type] on %d GPUs", l, r.GPUs)
		}
		link := gpuallocator.P2PLink{GPU: out[to], Type: links.P2PLinkType(kind)}
		out[from].Links[to] = append(out[from].Links[to], link)
	}
	return out, nil
}

func pick(all []*gpuallocator.Device, indexes []int) ([]*gpuallocator.Device, error) {
	out := []*gpuallocator.Device{}
	for _, i := range indexes {
		if i < 0 || i >= len(all) {
			return nil, fmt.Errorf("GPU %d is not one of %d", i, len(all))
		}
		out = append(out, all[i])
	}
	return out, nil
}

func answer(r request) ([]int, error) {
	all, err := devices(r)
	if err != nil {
		return nil, err
	}
	available, err := pick(all, r.Available)
	if err != nil {
		return nil, err
	}
	required, err := pick(all, r.Required)
	if err != nil {
		return nil, err
	}
	got := gpuallocator.NewBestEffortPolicy().Allocate(available, required, r.Size)
	out := make([]int, len(got))
	for i, d := range got {
		out[i] = -1
		if d != nil {
			out[i] = d.Index
		}
	}
	return out, nil
}

func main() {
	var requests []request
	if err := json.NewDecoder(os.Stdin).Decode(&requests); err != nil {
		fmt.Fprintf(os.Stderr, "gpuallocator: reading the requests: %v\n", err)
		os.Exit(1)
	}
	answers := make([][]int, len(requests))
	for i, r := range requests {
		a, err := answer(r)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gpuallocator: request %d: %v\n", i, err)
			os.Exit(1)
		}
		answers[i] = a
	}
	if err := json.NewEncoder(os.Stdout).Encode(answers); err != nil {
		fmt.Fprintf(os.Stderr, "gpuallocator: %v\n", err)
		os.Exit(1)
	}
}
