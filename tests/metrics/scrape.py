"""Parsing a ``/metrics`` answer for the metrics tests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by (sample name, labels)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample ``name`` with exactly ``labels``; ``None`` when absent."""
    return samples.get((name, frozenset(labels.items())))


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every sample whose labels include ``labels`` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


async def scrape(client: httpx.AsyncClient, url: str = "/metrics", **headers: str) -> Samples:
    response = await client.get(url, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)
