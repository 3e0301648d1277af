"""GPU-set math: the best set, availability, go-gpuallocator's policy."""
