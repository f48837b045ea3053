"""Runnable benchmarks: ``python -m benchmarks.<name>`` prints a table and writes JSON."""
