"""The overload scenario (`vllm-spark bench --scenario overload`): closed-loop load at a multiple of
the server's live capacity, judged on the per-stream floor.  It answers "what happens past the
capacity" on the user's own server: without the SLO guard every stream slows and none meets the
floor; with it (docs/guard.md) the admitted streams keep their rate and the wait moves into TTFT.

The capacity is read from the server's `/metrics` (`vllm_spark_slo_capacity_streams{floor}`, the
capacity under both SLOs, else `vllm_spark_capacity_streams{floor}`) unless `--overload-streams`
sets the load directly.  Reported: the share of requests whose per-stream rate meets the floor, rate
goodput (output tokens of those per second of the run), TTFT p50/p99, aggregate output tokens/s,
and, where the server runs the guard, its cap and the requests it held during the run.
"""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ..definitions import median, quantile
from .client import OpenAIStreamClient
from .scenarios import ScenarioError
from .sweep import run_closed_loop
from .workloads import PromptFactory, Workload

CAPACITY_SERIES = ("vllm_spark_slo_capacity_streams", "vllm_spark_capacity_streams")
GUARD_LIMIT = "vllm_spark_guard_admission_limit"
GUARD_HELD = "vllm_spark_guard_deferred_seconds"


def samples(metrics_text: str) -> dict[str, list[tuple[dict, float]]]:
    """{sample name: [(labels, value)]} of a /metrics text; unreadable text gives {}."""
    out: dict[str, list] = {}
    try:
        for fam in text_string_to_metric_families(metrics_text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
    except ValueError:
        return {}
    return out


def live_capacity(metrics_text: str, floor: float) -> tuple[int | None, str]:
    """(streams, series it came from) at `floor` tok/s; (None, why) when the server exports none."""
    got = samples(metrics_text)
    for name in CAPACITY_SERIES:
        vals = [v for labels, v in got.get(name, ()) if _same_floor(labels.get("floor"), floor)]
        if vals:
            return int(min(vals)), name  # several engines: the smallest is what one engine holds
    floors = sorted({labels.get("floor") for labels, _ in got.get(CAPACITY_SERIES[1], ())} - {None})
    why = (f"the server exports no live capacity at {floor:g} tok/s (its floors: {', '.join(floors)}; "
           "set SPARK_PLUGIN_FLOORS on the server)" if floors else
           "the server exports no live capacity (no vllm_spark_capacity_streams: is the plugin installed, "
           "and has the fit a verdict yet? serve some load first)")
    return None, why + "; or give the load with --overload-streams N"


def _same_floor(label: str | None, floor: float) -> bool:
    try:
        return label is not None and abs(float(label) - floor) < 1e-9
    except ValueError:
        return False


def _sum(got: dict, name: str) -> float:
    return sum(v for _, v in got.get(name, ()))


async def overload(client: OpenAIStreamClient, prompts: PromptFactory, workload: Workload, floor: float,
                   metrics, factor: float = 3.0, streams: int | None = None,
                   requests: int | None = None) -> dict:
    """Run the scenario.  `metrics`: an async callable returning the server's /metrics text (or
    None).  `streams` overrides the capacity read from it; `requests` defaults to three per stream."""
    before_text = await metrics() or ""
    source = "--overload-streams"
    capacity = None
    if streams is None:
        capacity, source = live_capacity(before_text, floor)
        if capacity is None:
            raise ScenarioError(source)
        streams = max(1, round(factor * max(1, capacity)))
    requests = requests or 3 * streams
    results, seconds = await run_closed_loop(client, prompts, workload, streams, requests, None)
    after = samples(await metrics() or "")
    before = samples(before_text)
    ok = [r.timing for r in results if r.ok]
    rates = [(t.decode_rate, t.output_tokens) for t in ok]
    met = [tokens for rate, tokens in rates if rate is not None and rate >= floor]
    total_tokens = sum(t.output_tokens for t in ok)
    ttfts = sorted(t.ttft for t in ok if t.ttft is not None)
    per_stream = [rate for rate, _ in rates if rate is not None]
    limit = [v for _, v in after.get(GUARD_LIMIT, ())]
    held = _sum(after, GUARD_HELD + "_count") - _sum(before, GUARD_HELD + "_count")
    held_s = _sum(after, GUARD_HELD + "_sum") - _sum(before, GUARD_HELD + "_sum")
    return {
        "scenario": "overload",
        "floor_tokens_per_second": floor,
        "capacity_streams": capacity,
        "capacity_source": source,
        "factor": factor if capacity is not None else None,
        "streams": streams,
        "requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "seconds": seconds,
        "rate_met_share": len(met) / len(ok) if ok else None,
        "rate_goodput_tokens_per_second": sum(met) / seconds if seconds > 0 else None,
        "output_tokens_per_second": total_tokens / seconds if seconds > 0 else None,
        "per_stream_median_tokens_per_second": median(per_stream),
        "ttft_p50_s": quantile(ttfts, 0.5),
        "ttft_p99_s": quantile(ttfts, 0.99),
        "guard_limit": min(limit) if limit else None,
        "guard_requests_held": held if GUARD_HELD + "_count" in after else None,
        "guard_mean_wait_s": held_s / held if held > 0 else None,
    }


def overload_line(res: dict) -> str:
    """One line for the progress output."""
    def f(v, spec=".0f"):
        return "-" if v is None else format(v, spec)
    share = res.get("rate_met_share")
    guard = (f"; guard cap {f(res['guard_limit'])}, {f(res['guard_requests_held'])} held "
             f"(mean wait {f(res['guard_mean_wait_s'], '.2f')} s)" if res.get("guard_limit") is not None else "")
    return (f"overload at {res['streams']} streams ({res['capacity_source']}"
            + (f" {res['capacity_streams']} x {res['factor']:g}" if res.get("capacity_streams") is not None else "")
            + f"): {f(None if share is None else 100 * share)}% of {res['completed']} requests at >= "
            f"{res['floor_tokens_per_second']:g} tok/s, rate goodput {f(res['rate_goodput_tokens_per_second'])} tok/s, "
            f"aggregate {f(res['output_tokens_per_second'])} tok/s, TTFT p50 {f(res['ttft_p50_s'], '.2f')} s "
            f"p99 {f(res['ttft_p99_s'], '.2f')} s" + guard)
