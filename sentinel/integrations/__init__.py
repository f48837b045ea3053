"""Sentinel inside application code: database connections and HTTP calls that resolve through
the client."""
