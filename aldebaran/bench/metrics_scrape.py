"""Reading the workers' Prometheus endpoints from the bench: their own counts of work done."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]  # a sample's labels, sorted: the key within one metric


def scrape(ports: list[int]) -> dict[str, dict[Labels, float]]:
    """Every sample of every process's /metrics, summed over processes: name -> labels -> value."""
    merged: dict[str, dict[Labels, float]] = {}
    for port in ports:
        try:
            # urllib, not an httpx client per call: building its TLS context cost the bench ~0.1 core.
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:  # URLError and timeouts: the process is not serving (yet)
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = tuple(sorted(sample.labels.items()))
                bucket = merged.setdefault(sample.name, {})
                bucket[key] = bucket.get(key, 0.0) + sample.value
    return merged


def total(metrics: dict[str, dict[Labels, float]], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for k, v in metrics.get(name, {}).items() if wanted <= set(k))
