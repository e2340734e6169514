"""The knee and SLO-capacity gauges: what one refit of an engine's step-time model publishes, and the
offline profile shown beside it.  Runs on the telemetry thread (`metrics.telemetry`), never on the
per-step path; no gauge is ever set to NaN or an infinity.
"""
from __future__ import annotations

import json
import math

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.knee import slo_capacity
from vllm_spark_plugin.knee.result import VERDICT_TOO_FEW, VERDICTS, floor_key


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def publish_verdict(ins, lv: tuple, verdict: str) -> None:
    """Exactly one verdict series is 1 (every verdict's series exists, so alerts can match on 0)."""
    for v in VERDICTS:
        ins.verdict.labels(*lv, v).set(1 if v == verdict else 0)


def publish_first(ins, lv: tuple) -> None:
    """An engine's knee series before its first refit: on /metrics from the first scrape."""
    publish_verdict(ins, lv, VERDICT_TOO_FEW)
    ins.fit_samples.labels(*lv).set(0)


def refresh(ins, model: str, st) -> None:
    """Refit one engine's step-time model (`st`: metrics.engine.EngineState) and set its gauges."""
    mean_batch = st.take_mean_batch()
    if st.knee is None:
        return
    res = st.knee.estimate(force=True)  # the telemetry loop's timer is the one throttle
    lv = (model, st.engine)
    publish_slo_capacity(ins, lv, st, res)
    n = getattr(res, "n", None) if res is not None else None
    ins.fit_samples.labels(*lv).set(n if _finite(n) else 0)
    publish_verdict(ins, lv, str(getattr(res, "verdict", VERDICT_TOO_FEW)) if res is not None else VERDICT_TOO_FEW)
    if res is None:
        return
    knee = res.knee
    for gauge, value in ((ins.knee, knee), (ins.max_throughput, res.plateau_tokens_per_second),
                         (ins.alpha, res.alpha_seconds), (ins.beta, res.beta_seconds), (ins.fit_r2, res.r2)):
        if _finite(value):
            gauge.labels(*lv).set(value)
    for floor, streams in (res.capacity or {}).items():
        if _finite(streams):
            ins.capacity.labels(*lv, floor_key(float(floor))).set(streams)
    if _finite(knee) and knee > 0:
        ins.knee_ratio.labels(*lv).set(mean_batch / knee)


def publish_slo_capacity(ins, lv: tuple, st, res) -> None:
    """TTFT capacity and its verdict, capacity under both SLOs per floor, and the spare capacity."""
    ttft = st.knee.ttft_capacity()
    if ttft.streams is not None:
        ins.capacity_ttft.labels(*lv).set(ttft.streams)
    for v in slo_capacity.VERDICTS:
        ins.capacity_ttft_verdict.labels(*lv, v).set(1 if v == ttft.verdict else 0)
    floor_caps = getattr(res, "capacity", None) or {}
    caps = []
    for f in st.floors:
        fc = floor_caps.get(floor_key(f))
        cap = slo_capacity.capacity_under_both(fc if _finite(fc) else None, ttft)
        caps.append(cap)
        if cap is not None:
            ins.slo_capacity.labels(*lv, floor_key(f)).set(cap)
    st.slo_capacity = tuple(caps)
    st.publish_spare()


def load_profile(ins, model: str, path: str) -> bool:
    """Offline capacity profile (written by `vllm-spark bench`) shown beside the live knee."""
    try:
        with open(path, encoding="utf-8") as fh:
            prof = json.load(fh)
        knee = prof.get("knee")
        plateau = prof.get("plateau_tokens_per_second")
        if _finite(knee):
            ins.profile_knee.labels(model).set(knee)
        if _finite(plateau):
            ins.profile_max.labels(model).set(plateau)
        for floor, streams in (prof.get("capacity") or {}).items():
            if _finite(streams):
                ins.profile_capacity.labels(model, floor_key(float(floor))).set(streams)
        return True
    except Exception as exc:
        errors.report("profile", exc)
        return False
