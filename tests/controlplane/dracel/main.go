// Command dracel checks topo-reporter's derived-attribute expressions (reporter/schema/dra_template.py)
// with Kubernetes' own DRA CEL compiler and evaluator, k8s.io/dynamic-resource-allocation/cel at
// the version this harness carries: the code that compiles a claim's CEL at the apiserver and
// evaluates it per device in the kube-scheduler's allocator.
//
// Each expression E is checked as the selector `(E) == W`, with W the list our Python model says
// the device must get (the claims made from the templates run on the real 1.37 scheduler in
// tests/controlplane/test_dra_connected.py): that compiles E in the DRA environment (its device
// type, cel.bind, optional lookups), and
// evaluating it on a device built from its attributes, as the allocator builds it, shows both
// that E runs without a runtime error and that its value is W.
//
// stdin: {"expression": E, "devices": [{"attributes": {name: {"string": s} | {"int": n} | ...},
// "want": [ids]}]}. stdout: {"cost": the compiler's worst-case cost estimate of the check, "results":
// [{"matches": bool, "error": text, "cost": the cost the evaluation ran up}]}; a compile error is
// one line on stderr and exit 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
)

type device struct {
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
	Want       []string                                                  `json:"want"`
}

type request struct {
	Expression string   `json:"expression"`
	Devices    []device `json:"devices"`
}

type result struct {
	Matches bool   `json:"matches"`
	Error   string `json:"error,omitempty"`
}

// evaluated is a result with the cost the evaluation actually ran up, for bench/.
type evaluated struct {
	result
	Cost uint64 `json:"cost"`
}

func main() {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fmt.Fprintf(os.Stderr, "dracel: stdin: %v\n", err)
		os.Exit(2)
	}
	compiler := dracel.GetCompiler(dracel.Features{})
	results := make([]evaluated, 0, len(req.Devices))
	var cost uint64
	for n, d := range req.Devices {
		want, err := json.Marshal(d.Want)
		if err != nil {
			fmt.Fprintf(os.Stderr, "dracel: device %d: %v\n", n, err)
			os.Exit(2)
		}
		// JSON's string literals and arrays of them are CEL literals as they stand.
		check := compiler.CompileCELExpression("("+req.Expression+") == "+string(want), dracel.Options{})
		if check.Error != nil {
			fmt.Fprintf(os.Stderr, "dracel: device %d: %v\n", n, check.Error)
			os.Exit(1)
		}
		cost = max(cost, check.MaxCost)
		matches, details, err := check.DeviceMatches(context.Background(), dracel.Device{
			Driver:     "gpu.nvidia.com",
			Attributes: d.Attributes,
		})
		r := evaluated{result: result{Matches: matches}}
		if err != nil {
			r.Error = err.Error()
		}
		if details != nil && details.ActualCost() != nil {
			r.Cost = *details.ActualCost()
		}
		results = append(results, r)
	}
	if err := json.NewEncoder(os.Stdout).Encode(map[string]any{"cost": cost, "results": results}); err != nil {
		fmt.Fprintf(os.Stderr, "dracel: stdout: %v\n", err)
		os.Exit(1)
	}
}
