"""Hypothesis over every reader; HYPOTHESIS_PROFILE=fuzz-long for a randomized run."""
