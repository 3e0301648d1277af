// Stands in for go-gpuallocator's gpuallocator/allocator.go (see main.go): only the Policy
// interface the policy's constructor returns. Written for the tests.
package gpuallocator

// Policy chooses `size` GPUs out of `available`, holding every GPU of `required`.
type Policy interface {
	Allocate(available []*Device, required []*Device, size int) []*Device
}
