"""The bench scripts on small inputs, so they cannot rot."""
