"""Benchmarks and checks, run from the repository root as ``python -m scripts.<folder>.<name>``."""
