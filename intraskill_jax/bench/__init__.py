"""Benchmarks: each prints JSON comparing against a peer in the same run."""
