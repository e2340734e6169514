"""The histogram bucket bounds a server exports and the ones a Prometheus rules file selects.

The SLO rules read histograms at one bound (`1 - bucket{le="T"} / count`); the server makes its TTFT
SLO and each of its floors a bound (`definitions.with_slo_bounds`).  Rules generated with values the
server does not run with select a bucket that does not exist: their ratio is absent and their alerts
stay silent.  `unmatched_bounds` names each such selector, for `vllm-spark doctor` and the tests.
"""
from __future__ import annotations

import math
import re

from vllm_spark_plugin.metrics.names import PREFIX

_BUCKET_SELECTOR = re.compile(r"\b(" + PREFIX + r"[a-z0-9_]+)_bucket\s*\{([^}]*)\}")
_LE = re.compile(r'\ble\s*=\s*"([^"]*)"')


def exported_bounds(metrics_text: str) -> dict[str, tuple[float, ...]]:
    """{histogram: its finite bucket bounds, sorted} of the plugin's histograms in a /metrics text (a
    histogram shows its buckets once a labelled child exists: the serving ones from an engine's start)."""
    from prometheus_client.parser import text_string_to_metric_families
    found: dict[str, set[float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.type != "histogram" or not family.name.startswith(PREFIX):
            continue
        for s in family.samples:
            if s.name.endswith("_bucket") and "le" in s.labels:
                le = float(s.labels["le"])
                if math.isfinite(le):
                    found.setdefault(family.name, set()).add(le)
    return {name: tuple(sorted(v)) for name, v in found.items()}


def rule_expressions(rules_text: str) -> list[str]:
    """Every rule's `expr` in a Prometheus rules file; ValueError when the text is not one."""
    import yaml
    try:
        doc = yaml.safe_load(rules_text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {exc}".splitlines()[0]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise ValueError("not a Prometheus rules file (no `groups:` list)")
    return [str((rule or {}).get("expr", "")) for group in doc["groups"] for rule in (group or {}).get("rules") or []]


def selected_bounds(rules_text: str) -> dict[str, tuple[float, ...]]:
    """{histogram: the `le` bounds its `_bucket` selectors name, sorted} over every expression of a
    Prometheus rules file; ValueError when the text is not a rules file."""
    found: dict[str, set[float]] = {}
    for expr in rule_expressions(rules_text):
        for name, matchers in _BUCKET_SELECTOR.findall(expr):
            for le in _LE.findall(matchers):
                try:
                    found.setdefault(name, set()).add(float(le))
                except ValueError:
                    continue  # a regex matcher on le: not one bound
    return {name: tuple(sorted(v)) for name, v in found.items()}


def unmatched_bounds(rules_text: str, metrics_text: str) -> list[str]:
    """Each bound the rules select on a histogram the server exports without that bound, as
    'HISTOGRAM le=BOUND (the server's nearest: A, B)'; empty when every selector has its bucket.
    Histograms the server does not show yet (no child) are not judged."""
    exported = exported_bounds(metrics_text)
    out = []
    for name, bounds in sorted(selected_bounds(rules_text).items()):
        have = exported.get(name)
        if not have:
            continue
        for b in bounds:
            if not any(math.isclose(b, h, rel_tol=1e-12, abs_tol=0) for h in have):
                near = [f"{h:g}" for h in have if h < b][-1:] + [f"{h:g}" for h in have if h > b][:1]
                out.append(f"{name} le={b:g} (the server's nearest: {', '.join(near)})")
    return out
