"""Sentinel inside application code: database connections and HTTP calls that resolve, report
failures, retry elsewhere and follow credential rotations by themselves.

Each integration is a module of its own with its own extra (from a checkout:
``pip install -e '.[postgres]'``), so the core keeps its dependencies; see
``docs/integrations.md``.
"""
