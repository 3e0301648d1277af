"""What the agent shows the world while it runs: health state, Prometheus metrics, the HTTP server."""
