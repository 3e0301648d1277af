"""The way to the cluster: both API clients, the patch, the sinks, prune, against the double."""
