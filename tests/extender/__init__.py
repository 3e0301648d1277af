"""The scheduler extender: its protocol, cache, holds, HTTP server and metrics."""
