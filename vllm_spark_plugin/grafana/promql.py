"""PromQL building blocks shared by the dashboards and the rules, so both read the same series.

Metric names come from the public contract (`vllm_spark_plugin.metrics.names`).  vLLM's own series
are matched as `{__name__=~"vllm[:_]NAME"}`: whether the colon survives the scrape depends on the
exposition and the scraper (Prometheus 2.42 stored vLLM 0.32's `vllm:num_requests_running` with its
colon, but `vllm_...` for the same name served by a bare prometheus-client 0.26 HTTP server).
"""
from __future__ import annotations

import math

from prometheus_client.utils import floatToGoString

from vllm_spark_plugin.metrics import names as N

# Dashboard template variables (Grafana substitutes them; tests substitute them too).  Serving series
# carry model_name and engine; host series (GPU, unified memory, PSI, plugin errors) carry neither, so
# they are selected by instance alone.
DASH_SEL = 'model_name=~"$model", instance=~"$instance"'
HOST_SEL = 'instance=~"$instance"'
RATE = "$__rate_interval"

# The clock-event reasons that explain a slow GPU (NVML throttle reasons: sw/hw thermal, sw/hw power
# cap, hw slowdown).  Matched case-insensitively on the `reason` label of vllm_spark_gpu_clock_event_active.
THROTTLE_REASON_RE = "(?i).*(thermal|power|slowdown).*"
# PSI "some" share over 60 s (labels kind=some|full, window=avg10|avg60|avg300).
PSI_SOME_60 = ('kind="some"', 'window="avg60"')


def le(value: float) -> str:
    """The `le` label value prometheus-client writes for a bucket bound (2 -> "2.0")."""
    return floatToGoString(float(value))


def floor_matcher(floor: float) -> str:
    """A matcher for the `floor` label of capacity gauges, whether exported as "20" or "20.0"."""
    if float(floor).is_integer():
        return f'floor=~"{int(floor)}(\\\\.0+)?"'
    text = repr(float(floor)).replace(".", "\\\\.")
    return f'floor=~"{text}0*"'


def sel(name: str, *matchers: str, base: str = "") -> str:
    parts = [p for p in (base, *matchers) if p]
    return f"{name}{{{', '.join(parts)}}}" if parts else name


def vllm(name: str, *matchers: str, base: str = "") -> str:
    """vLLM's own series `vllm:NAME`, however the colon was stored."""
    return "{" + ", ".join([f'__name__=~"vllm[:_]{name}"', *[p for p in (base, *matchers) if p]]) + "}"


def rate(name: str, window: str, *matchers: str, base: str = "") -> str:
    return f"rate({sel(name, *matchers, base=base)}[{window}])"


def by(labels: str) -> str:
    return f" by ({labels})" if labels else ""


def hist_quantile(q: float, hist: str, window: str, group: str = "", *, base: str = "", extra: str = "") -> str:
    """histogram_quantile over the classic buckets of `hist`, grouped by `group` (plus le)."""
    labels = ", ".join(x for x in (group, "le") if x)
    return (f"histogram_quantile({q:g}, sum by ({labels}) "
            f"({rate(hist + '_bucket', window, extra, base=base)}))")


def hist_mean(hist: str, window: str, group: str = "", *, base: str = "", extra: str = "") -> str:
    return (f"sum{by(group)} ({rate(hist + '_sum', window, extra, base=base)}) / "
            f"sum{by(group)} ({rate(hist + '_count', window, extra, base=base)})")


def share_at_or_below(hist: str, bound: float, window: str, group: str = "", *, base: str = "") -> str:
    """Share of observations <= bound (exact: bound is a bucket bound)."""
    le_match = 'le="' + le(bound) + '"'
    return (f"sum{by(group)} ({rate(hist + '_bucket', window, le_match, base=base)}) / "
            f"sum{by(group)} ({rate(hist + '_count', window, base=base)})")


def fleet_capacity(floor: float, base: str = "") -> str:
    """Streams the selected instances can carry at the per-stream floor (sum over engines and hosts)."""
    return f"sum ({sel(N.CAPACITY_STREAMS, floor_matcher(floor), base=base)})"


def instance_capacity(floor: float, base: str = "") -> str:
    return f"sum by (instance) ({sel(N.CAPACITY_STREAMS, floor_matcher(floor), base=base)})"


def fleet_knee_ratio(base: str = "") -> str:
    """Running streams over the summed knees: 1 means the fleet as a whole sits at its knee."""
    return f"sum ({sel(N.RUNNING, base=base)}) / sum ({sel(N.KNEE_BATCH, base=base)})"


def isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def link_bytes_rate(window: str, group: str = "instance, interface", *, base: str = "") -> str:
    """Bytes/s one interface carried, transmitted plus received (so up to twice its rate, full duplex)."""
    return (f"sum by ({group}) ({rate(N.LINK_TRANSMIT, window, base=base)}) + "
            f"sum by ({group}) ({rate(N.LINK_RECEIVE, window, base=base)})")


def profile_step_seconds(window: str, group: str, *, base: str = "") -> str:
    """The offline profile's step time at the current mean batch b: its fitted line (K + b) / plateau
    is the time per generated token of a stream, times the tokens a stream gains per step (1 without
    speculative decoding) it is the time of a step.  Absent without a profile (SPARK_PLUGIN_PROFILE)."""
    return (f"(max by ({group}) ({sel(N.PROFILE_KNEE_BATCH, base=base)}) + "
            f"{hist_mean(N.STEP_BATCH_SIZE, window, group, base=base)}) "
            f"/ max by ({group}) ({sel(N.PROFILE_MAX_THROUGHPUT, base=base)}) "
            f"* sum by ({group}) ({rate(N.GENERATION_TOKENS, window, base=base)}) "
            f"/ sum by ({group}) ({rate(N.STEP_BATCH_SIZE + '_sum', window, base=base)})")
