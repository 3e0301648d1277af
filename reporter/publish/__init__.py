"""Publishing a topology: the minimal node patch, the Kubernetes client seam, sinks and Events."""
