"""Benchmarks driven by `make bench`."""
