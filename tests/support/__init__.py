"""Helpers of the tests, not tests: doubles, fixtures, strategies, the Go harness's driver."""
