"""Benchmarks, run by hand (`make bench`) or in CI's smoke mode; never timed assertions."""
