"""The one topology model and its projections: the JSON of schema v2 (v1 still read), labels, the
matrix text."""
