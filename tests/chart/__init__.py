"""The Helm chart: rendered, linted and validated, its policies, alerts and dashboard."""
