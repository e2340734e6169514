"""Reading a real /metrics endpoint in tests."""
from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} for every sample on the page."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    """Sum of the samples named `name` whose labels include `labels` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def buckets(samples: dict, name: str, **labels) -> dict[float, float]:
    """Cumulative histogram buckets {le: count} summed over matching series."""
    want = set(labels.items())
    out: dict[float, float] = {}
    for (n, lab), v in samples.items():
        if n == name + "_bucket" and want <= set(lab):
            le = float(dict(lab)["le"])
            out[le] = out.get(le, 0.0) + v
    return dict(sorted(out.items()))


def delta_buckets(after: dict, before: dict) -> dict[float, float]:
    return {le: after[le] - before.get(le, 0.0) for le in after}


def histogram_quantile(q: float, cum: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative buckets (linear within a bucket)."""
    items = sorted(cum.items())
    total = items[-1][1] if items else 0
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in items:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return items[-1][0]


def wait_idle(metrics_url: str, timeout: float = 60.0) -> dict:
    """Scrape until the plugin reports no running and no waiting request; the idle scrape."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = scrape(metrics_url)
        if value(s, "vllm_spark_running_requests") == 0 and value(s, "vllm_spark_waiting_requests") == 0:
            return s
        time.sleep(0.2)
    raise AssertionError("server did not go idle")
