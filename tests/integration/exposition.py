"""Reading a Prometheus endpoint the way Prometheus would: over HTTP, with its own parser."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(port):
    """Every sample at ``http://127.0.0.1:<port>/metrics``, by (name, sorted label pairs)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
