"""What the agent shows while it runs: health state, Prometheus metrics, the HTTP server."""
