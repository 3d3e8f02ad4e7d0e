"""Reading the broker's Prometheus /metrics in tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape_url(url: str, timeout: float = 10.0) -> tuple[str, Samples]:
    """The Content-Type and every sample of ``url``, by sample name."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        content_type = r.headers["Content-Type"]
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return content_type, out


def sample(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` with ``labels``."""
    found = [v for lbl, v in samples.get(name, []) if all(lbl.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]
