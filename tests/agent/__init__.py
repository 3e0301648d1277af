"""The agent's loop (`run`) against the API server double: what it publishes, serves and tells."""
