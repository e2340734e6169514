"""A measured interconnect rate for the planner: `vllm-spark plan --link-rate RATE` and
`--link-rate-from URL|FILE` (docs/plan.md, "A measured link").

RATE is bytes/s, or a number with a unit: `12.5Gbit`, `12.5Gb/s`, `100Gbps` (bits, lower-case b) or
`1.5GB/s`, `1.5GBps` (bytes, upper-case B), with the decimal prefixes k, M, G, T.  A prefix without a
unit (`12.5G`) is refused: bits and bytes differ eightfold.

`--link-rate-from` reads one of two documents, from a file or an http(s) URL:

* a `/metrics` exposition of the plugin: the `vllm_spark_link_rate_bytes_per_second` samples, the
  negotiated rate of each selected interface; the slowest one is taken, since a ring runs at the pace
  of its slowest link.  It shows a link that negotiated below its rate, not one that negotiated well
  and carries little: for that, measure;
* the JSON report of `vllm-spark doctor --link-probe HOST --json`: `probe.achieved_bytes_per_second`,
  the TCP throughput the probe achieved (a lower bound of what NCCL over RDMA gets on the same link).
"""
from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# metrics.names.LINK_RATE (plan/ does not import metrics/; tests/unit/test_plan_link.py checks they agree)
LINK_RATE_METRIC = "vllm_spark_link_rate_bytes_per_second"
MIN_RATE = 1e6      # bytes/s: below this a number without a unit was almost surely meant in Gbit
MAX_RATE = 1e12     # bytes/s (8 Tb/s): above this the unit is wrong
URL_TIMEOUT = 5.0
MAX_DOCUMENT_BYTES = 32 << 20

_RATE = re.compile(r"\s*(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<prefix>[kKMGT]?)"
                   r"(?P<unit>[bB][iI][tT]|b|B)?(?P<per>/s|/sec|ps)?\s*")
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


class LinkRateError(ValueError):
    """A link rate or its source that cannot be used; the message names the problem."""


@dataclass(frozen=True)
class LinkRate:
    bytes_per_second: float
    source: str   # where the figure came from, said in the report


def format_rate(bytes_per_second: float) -> str:
    return f"{bytes_per_second / 1e9:.3g} GB/s ({bytes_per_second * 8 / 1e9:.3g} Gbit/s)"


def _checked(value: float, what: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise LinkRateError(f"{what}: expected a positive, finite link rate")
    if value < MIN_RATE:
        raise LinkRateError(f"{what}: {value:g} bytes/s is not a plausible link rate; give a unit, "
                            "e.g. 12.5Gbit (bits/s) or 1.5GB/s (bytes/s)")
    if value > MAX_RATE:
        raise LinkRateError(f"{what}: {value:g} bytes/s is above any link's rate (8 Tbit/s); check the unit")
    return value


def parse_rate(text: str) -> float:
    """Bytes/s from `1.5e9`, `12.5Gbit`, `12.5Gb/s`, `1.5GB/s` (see the module docstring)."""
    m = _RATE.fullmatch(str(text))
    if not m:
        raise LinkRateError(f"{text!r} is not a link rate: use bytes/s (1.5e9) or a unit (12.5Gbit, 1.5GB/s)")
    unit = m.group("unit")
    if unit is None and (m.group("prefix") or m.group("per")):
        raise LinkRateError(f"{text!r} has no unit: say {m.group('num')}{m.group('prefix')}bit for bits/s or "
                            f"{m.group('num')}{m.group('prefix')}B/s for bytes/s")
    value = float(m.group("num")) * _PREFIX[m.group("prefix")]
    if unit is not None and unit != "B":
        value /= 8
    return _checked(value, repr(text))


def from_metrics(text: str, where: str) -> LinkRate:
    """The slowest negotiated rate among the `vllm_spark_link_rate_bytes_per_second` samples."""
    from prometheus_client.parser import text_string_to_metric_families

    rates: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == LINK_RATE_METRIC and math.isfinite(s.value) and s.value > 0:
                    rates[s.labels.get("interface", "?")] = float(s.value)
    except (ValueError, TypeError, IndexError) as exc:
        raise LinkRateError(f"{where}: not a Prometheus exposition ({exc})") from None
    if not rates:
        raise LinkRateError(f"{where}: no {LINK_RATE_METRIC} sample; the plugin exports it for the interfaces it "
                            "selects (SPARK_PLUGIN_LINKS, docs/links.md) whose speed the kernel reports")
    slowest = min(rates, key=rates.get)
    others = ", ".join(f"{i} {format_rate(r)}" for i, r in sorted(rates.items()) if i != slowest)
    rate = _checked(rates[slowest], f"{where}: {LINK_RATE_METRIC}{{interface={slowest!r}}}")
    return LinkRate(rate, f"{where}: negotiated rate of {slowest}, the slowest selected link"
                    + (f" (others: {others})" if others else ""))


def from_probe_report(doc: object, where: str) -> LinkRate:
    """`probe.achieved_bytes_per_second` of a `vllm-spark doctor --link-probe HOST --json` report."""
    if not isinstance(doc, dict):
        raise LinkRateError(f"{where}: expected the JSON object of `vllm-spark doctor --link-probe HOST --json`")
    if doc.get("ok") is False:
        raise LinkRateError(f"{where}: the probe did not measure: {doc.get('error', 'no reason given')}")
    probe = doc.get("probe")
    if not isinstance(probe, dict) or "achieved_bytes_per_second" not in probe:
        raise LinkRateError(f"{where}: no probe.achieved_bytes_per_second (is this a `vllm-spark doctor "
                            "--link-probe HOST --json` report?)")
    value = probe["achieved_bytes_per_second"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LinkRateError(f"{where}: probe.achieved_bytes_per_second is {value!r}, not a number")
    rate = _checked(float(value), f"{where}: probe.achieved_bytes_per_second")
    over = f" over {probe['interface']}" if probe.get("interface") else ""
    negotiated = probe.get("negotiated_bytes_per_second")
    against = f", negotiated {format_rate(negotiated)}" if isinstance(negotiated, (int, float)) and negotiated > 0 else ""
    return LinkRate(rate, f"{where}: TCP throughput the probe achieved to {probe.get('peer', '?')}{over}{against}")


def _read(spec: str) -> str:
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", spec):
        if not spec.lower().startswith(("http://", "https://")):
            raise LinkRateError(f"{spec}: only http:// and https:// URLs are read")
        try:
            with urllib.request.urlopen(spec, timeout=URL_TIMEOUT) as resp:
                return resp.read(MAX_DOCUMENT_BYTES).decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            raise LinkRateError(f"{spec}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise LinkRateError(f"cannot read {spec}: {reason}") from None
    try:
        with open(Path(spec).expanduser(), encoding="utf-8", errors="replace") as fh:
            return fh.read(MAX_DOCUMENT_BYTES)
    except OSError as exc:
        raise LinkRateError(f"cannot read {spec}: {exc.strerror or exc}") from None


def read_source(spec: str) -> LinkRate:
    """A link rate from a `/metrics` text or a probe JSON report, in a file or at an http(s) URL."""
    text = _read(spec)
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise LinkRateError(f"{spec}: not valid JSON ({exc})") from None
        return from_probe_report(doc, spec)
    return from_metrics(text, spec)


def given(text: str) -> LinkRate:
    """--link-rate TEXT."""
    return LinkRate(parse_rate(text), f"--link-rate {text.strip()}")


def combine(rate: LinkRate | None, source: str | None) -> LinkRate | None:
    """--link-rate and --link-rate-from together: the slower of the two (the link is at most that fast)."""
    rates = [r for r in (rate, None if source is None else read_source(source)) if r is not None]
    if not rates:
        return None
    slowest = min(rates, key=lambda r: r.bytes_per_second)
    if len(rates) == 1:
        return slowest
    other = next(r for r in rates if r is not slowest)
    return LinkRate(slowest.bytes_per_second, f"{slowest.source}, the slower of it and {other.source} "
                                               f"({format_rate(other.bytes_per_second)})")
