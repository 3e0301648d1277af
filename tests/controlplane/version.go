package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	_ "unsafe" // for go:linkname

	"k8s.io/component-base/version"
)

// A release build of Kubernetes stamps its version into k8s.io/component-base/version with
// -ldflags -X. `go build -o BIN .` cannot pass ldflags, so the version is taken from the module
// graph instead: the server then reports the release it really runs (what `kubectl version` shows)
// rather than v0.0.0-master.

//go:linkname gitVersion k8s.io/component-base/version.gitVersion
var gitVersion string

//go:linkname gitMajor k8s.io/component-base/version.gitMajor
var gitMajor string

//go:linkname gitMinor k8s.io/component-base/version.gitMinor
var gitMinor string

//go:linkname gitTreeState k8s.io/component-base/version.gitTreeState
var gitTreeState string

func init() {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	for _, dep := range info.Deps {
		if dep.Path != "k8s.io/kubernetes" {
			continue
		}
		parts := strings.SplitN(strings.TrimPrefix(dep.Version, "v"), ".", 3)
		if len(parts) < 2 {
			return
		}
		gitVersion, gitMajor, gitMinor, gitTreeState = dep.Version, parts[0], parts[1], "clean"
		// The package copied gitVersion into its served value at its own init, before this one.
		if err := version.SetDynamicVersion(dep.Version); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane: version %s: %v\n", dep.Version, err)
		}
		return
	}
}
