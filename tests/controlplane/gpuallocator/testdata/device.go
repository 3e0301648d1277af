// Stands in for go-gpuallocator's gpuallocator/device.go (see main.go): the two types
// besteffort_policy.go reads, without NVML. Written for the tests, not taken from go-gpuallocator.
package gpuallocator

import "github.com/NVIDIA/go-gpuallocator/internal/links"

// Device is a GPU as the policy sees it: its index and its links to the other GPUs.
type Device struct {
	Index int
	Links map[int][]P2PLink
}

// P2PLink is one link to another GPU: a PCIe path class or an NVLink count.
type P2PLink struct {
	GPU  *Device
	Type links.P2PLinkType
}
