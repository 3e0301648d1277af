"""The one topology model and its projections: schema v1 JSON, labels, the matrix text."""
