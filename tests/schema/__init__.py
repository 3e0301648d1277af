"""The schema and its pure projections: the codec, labels, the matrix, NRT, pictures."""
