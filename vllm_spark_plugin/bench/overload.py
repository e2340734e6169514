"""The load scenarios (`vllm-spark bench --scenario overload|poisson|shift`): load at a multiple of
the server's live capacity, every request judged on the per-stream floor and, with `--slo-ttft`, on
TTFT.  They answer "what happens past the capacity" on the user's own server: without the SLO guard
every stream slows and none meets the floor; with it (docs/guard.md) the admitted streams keep their
rate and the wait moves into TTFT.

* overload: closed loop, `factor` x capacity streams each keeping one request in flight;
* poisson: open loop, requests arrive as a Poisson process (seeded) at `factor` x the capacity's
  request rate, C x F / output tokens (the requests C streams at the floor F complete per second):
  arrivals do not wait for completions, so a queue shows as TTFT (judge it with `--slo-ttft`);
* shift: closed loop like overload, but after `shift_after_requests` requests (or seconds) every
  request asks for `output_factor` x the output tokens and `prompt_factor` x the prompt tokens: the
  request mix a cap was set for changes under it.

Warm or cold is the server's state (a fresh server is cold; after a ramp it is warm): the harness
that starts the servers decides it (benchmarks/guard_effect.py).

The capacity C is read from the server's `/metrics` (`vllm_spark_slo_capacity_streams{floor}`, the
capacity under both SLOs, else `vllm_spark_capacity_streams{floor}`) unless `--overload-streams` /
`--poisson-rate` set the load directly.  Per request: the per-stream rate (seed definition), TTFT,
met floor, met TTFT (`definitions.slo_outcome`).  Per run, over ALL offered requests (a failed one
meets nothing, so losing requests cannot look good): the share meeting the floor and both SLOs, rate
goodput and SLO goodput (output tokens of those per second of the run), TTFT p50/p99, aggregate
output tokens/s; the same from the server's own SLO counters over the run (`vllm_spark_slo_*`, judged
by the server's TTFT SLO at the same floor); where the server runs the guard, its cap and the
requests it held.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

from ..definitions import SLO_MET, SLO_MISSED_RATE, SLO_MISSED_TTFT, SLO_OUTCOMES, median, quantile, slo_outcome
from ..metrics import names as N
from .client import OpenAIStreamClient, StreamResult
from .scenarios import ScenarioError
from .workloads import PromptFactory, Workload

LOAD_SCENARIOS = ("overload", "poisson", "shift")
CAPACITY_SERIES = (N.SLO_CAPACITY, N.CAPACITY_STREAMS)
GUARD_LIMIT = N.GUARD_ADMISSION_LIMIT
GUARD_HELD = N.GUARD_DEFERRED_SECONDS
BEFORE, AFTER = "before", "after"  # a shift's two phases
POISSON_REQUESTS = 60  # poisson at a given --poisson-rate: requests in all unless --overload-requests

MetricsSource = Callable[[], Awaitable[str | None]]


@dataclass(frozen=True)
class LoadConfig:
    """One load scenario as the command line gives it."""

    scenario: str = "overload"
    floor: float = 20.0
    ttft_slo: float | None = None
    factor: float = 3.0                  # x the live capacity (closed loop: streams; poisson: request rate)
    streams: int | None = None           # closed loop: this many streams instead
    arrival_rate: float | None = None    # poisson: requests/s instead
    requests: int | None = None          # in all (default: three per closed-loop stream)
    shift_after_requests: int | None = None
    shift_after_seconds: float | None = None
    output_factor: int = 4
    prompt_factor: int = 8
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.scenario not in LOAD_SCENARIOS:
            raise ValueError(f"unknown load scenario {self.scenario!r}; choose from {', '.join(LOAD_SCENARIOS)}")


class WallClock:
    """The client's clock (the scenarios take any object with `now()` and `async sleep_until(t)`;
    the unit tests hand them the fake server's simulated clock)."""

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    async def sleep_until(self, t: float) -> float:
        delay = t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        return time.perf_counter()


# ------------------------------------------------------------------------------------------- plan
def shifted_workload(workload: Workload, output_factor: int, prompt_factor: int) -> Workload:
    """The request shape after a shift: `output_factor` x the output, `prompt_factor` x the prompt."""
    return replace(workload, output_tokens=workload.output_tokens * output_factor,
                   input_tokens=(workload.input_tokens or 256) * prompt_factor)


@dataclass(frozen=True)
class LoadPlan:
    """Which request shape the request issued `index`-th, `elapsed` seconds into the run, gets."""

    workload: Workload
    after: Workload | None = None        # the shape after the shift (None: no shift)
    after_requests: int | None = None
    after_seconds: float | None = None

    def at(self, index: int, elapsed: float) -> tuple[str, Workload]:
        if self.after is None:
            return "", self.workload
        shifted = (index >= self.after_requests if self.after_requests is not None
                   else elapsed >= (self.after_seconds or 0.0))
        return (AFTER, self.after) if shifted else (BEFORE, self.workload)


def poisson_schedule(rate: float, count: int, seed: int | None = None) -> list[float]:
    """Send times (seconds from the start) of `count` Poisson arrivals at `rate` per second: the
    first at 0, then exponential gaps.  The same seed gives the same schedule."""
    if not rate > 0:
        raise ValueError(f"arrival rate must be positive, got {rate!r}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(count):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def capacity_request_rate(capacity: int, floor: float, output_tokens: int) -> float:
    """Requests per second that `capacity` streams at `floor` tok/s complete: C x F / output tokens."""
    return capacity * floor / output_tokens


# ------------------------------------------------------------------------------------------ runners
@dataclass
class Sent:
    """One offered request: its shape, when it was sent (seconds from the run start) and its result."""

    index: int
    phase: str
    sent_s: float
    result: StreamResult


def _prebuilt(prompts: PromptFactory, plan: LoadPlan, count: int, token_ids: bool) -> list[dict]:
    """Every prompt built before the clock starts (exact-length prompts cost client CPU), one per
    index and shape that index can get."""
    shapes = [plan.workload] + ([plan.after] if plan.after is not None else [])
    return [{id(w): prompts.prompt(w, i, token_ids) for w in shapes} for i in range(count)]


async def run_closed(client: OpenAIStreamClient, prompts: PromptFactory, plan: LoadPlan, streams: int,
                     requests: int, clock=None) -> tuple[list[Sent], float]:
    """`streams` workers each keep one request in flight until `requests` were sent."""
    clock = clock or WallClock()
    ready = _prebuilt(prompts, plan, requests, client.token_ids_allowed)
    sent: list[Sent] = []
    issued = 0
    t0 = clock.now()

    async def worker() -> None:
        nonlocal issued
        while issued < requests:
            index = issued
            issued += 1
            at = clock.now() - t0
            phase, w = plan.at(index, at)
            res = await client.stream(ready[index][id(w)], w.output_tokens, w.temperature)
            sent.append(Sent(index, phase, at, res))

    await asyncio.gather(*(worker() for _ in range(streams)))
    return sorted(sent, key=lambda s: s.index), clock.now() - t0


async def run_open(client: OpenAIStreamClient, prompts: PromptFactory, plan: LoadPlan, schedule: list[float],
                   clock=None) -> tuple[list[Sent], float]:
    """Send request i at `schedule[i]` seconds from the start, whether or not earlier ones finished."""
    clock = clock or WallClock()
    ready = _prebuilt(prompts, plan, len(schedule), client.token_ids_allowed)
    t0 = clock.now()

    async def one(index: int, at: float, phase: str, w: Workload) -> Sent:
        res = await client.stream(ready[index][id(w)], w.output_tokens, w.temperature)
        return Sent(index, phase, at, res)

    tasks = []
    try:
        for i, when in enumerate(schedule):
            await clock.sleep_until(t0 + when)
            at = clock.now() - t0
            phase, w = plan.at(i, at)
            tasks.append(asyncio.create_task(one(i, at, phase, w)))
        done = list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
    return done, clock.now() - t0


# ------------------------------------------------------------------------------------------ judging
def request_row(s: Sent, floor: float, ttft_slo: float | None) -> dict:
    """One offered request as judged: its rate (seed definition), TTFT, and whether it met the floor,
    the TTFT SLO and both (`definitions.slo_outcome`; a failed request met nothing)."""
    t = s.result.timing
    failed = t.error is not None or t.first_token is None
    rate = None if failed else t.decode_rate
    outcome = slo_outcome(None if failed else t.ttft, rate, ttft_slo, floor)
    return {"index": s.index, "phase": s.phase, "sent_s": round(s.sent_s, 6),
            "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens,
            "ttft_s": None if failed else t.ttft, "rate_tokens_per_second": rate,
            "met_floor": not failed and outcome in (SLO_MET, SLO_MISSED_TTFT),
            "met_ttft": outcome in (SLO_MET, SLO_MISSED_RATE), "met_slo": outcome == SLO_MET,
            "bunched": s.result.bunched, "error": t.error}


def judge(rows: list[dict], seconds: float) -> dict:
    """Per-run figures over all offered requests `rows` (from `request_row`) in `seconds` of run."""
    ok = [r for r in rows if r["error"] is None]
    n = len(rows)

    def tokens(rs):
        return sum(r["output_tokens"] for r in rs)

    def per_s(x):
        return x / seconds if seconds > 0 else None
    ttfts = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    return {
        "requests": n, "completed": len(ok), "errors": n - len(ok),
        "bunched_streams": sum(1 for r in ok if r["bunched"]),
        "seconds": seconds,
        "rate_met_share": sum(r["met_floor"] for r in rows) / n if n else None,
        "ttft_met_share": sum(r["met_ttft"] for r in rows) / n if n else None,
        "slo_met_share": sum(r["met_slo"] for r in rows) / n if n else None,
        "rate_goodput_tokens_per_second": per_s(tokens(r for r in rows if r["met_floor"])),
        "slo_goodput_tokens_per_second": per_s(tokens(r for r in rows if r["met_slo"])),
        "output_tokens_per_second": per_s(tokens(ok)),
        "per_stream_median_tokens_per_second": median(r["rate_tokens_per_second"] for r in ok),
        "ttft_p50_s": quantile(ttfts, 0.5),
        "ttft_p99_s": quantile(ttfts, 0.99),
    }


# ------------------------------------------------------------------------------- the server's side
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
    return None, why + "; or give the load with --overload-streams N (or --poisson-rate R)"


def _same_floor(label: str | None, floor: float) -> bool:
    try:
        return label is not None and abs(float(label) - floor) < 1e-9
    except ValueError:
        return False


def _sum(got: dict, name: str, floor: float | None = None, outcome: str | None = None) -> float:
    return sum(v for labels, v in got.get(name, ())
               if (floor is None or _same_floor(labels.get("floor"), floor))
               and (outcome is None or labels.get("outcome") == outcome))


def server_figures(before_text: str, after_text: str, floor: float, seconds: float) -> dict:
    """The run as the server judged it: the change of its SLO counters at `floor` over the run
    (every request the server finished in that time, by its own TTFT SLO and clock).  Empty values
    when the server has no counters at that floor (SPARK_PLUGIN_FLOORS)."""
    before, after = samples(before_text), samples(after_text)
    req, tok = N.SLO_REQUESTS, N.SLO_OUTPUT_TOKENS
    if not any(_same_floor(labels.get("floor"), floor) for labels, _ in after.get(req, ())):
        return {"server_requests": None, "server_note": f"the server has no SLO counters at {floor:g} tok/s "
                                                      "(add it to SPARK_PLUGIN_FLOORS)"}

    def delta(name, outcome=None):
        return _sum(after, name, floor, outcome) - _sum(before, name, floor, outcome)
    n = delta(req)
    by = {o: delta(req, o) for o in SLO_OUTCOMES}
    ttft_slo = [v for _, v in after.get(N.TTFT_SLO, ())]
    return {
        "server_requests": n,
        "server_ttft_slo_s": ttft_slo[0] if ttft_slo else None,
        "server_outcomes": by,
        "server_rate_met_share": (by[SLO_MET] + by[SLO_MISSED_TTFT]) / n if n else None,
        "server_slo_met_share": by[SLO_MET] / n if n else None,
        "server_rate_goodput_tokens_per_second": ((delta(tok, SLO_MET) + delta(tok, SLO_MISSED_TTFT)) / seconds
                                                  if seconds > 0 else None),
        "server_slo_goodput_tokens_per_second": delta(tok, SLO_MET) / seconds if seconds > 0 else None,
    }


def guard_figures(before_text: str, after_text: str) -> dict:
    """The guard's cap at the end of the run and the requests it held during it (None: guard off)."""
    before, after = samples(before_text), samples(after_text)
    limit = [v for _, v in after.get(GUARD_LIMIT, ())]
    held = _sum(after, GUARD_HELD + "_count") - _sum(before, GUARD_HELD + "_count")
    held_s = _sum(after, GUARD_HELD + "_sum") - _sum(before, GUARD_HELD + "_sum")
    return {"guard_limit": min(limit) if limit else None,
            "guard_limits": {labels.get("engine", ""): v for labels, v in after.get(GUARD_LIMIT, ())},
            "guard_requests_held": held if GUARD_HELD + "_count" in after else None,
            "guard_mean_wait_s": held_s / held if held > 0 else None}


# -------------------------------------------------------------------------------------- the scenario
async def run_load(client: OpenAIStreamClient, prompts: PromptFactory, workload: Workload, cfg: LoadConfig,
                   metrics: MetricsSource, clock=None) -> dict:
    """Run one load scenario.  `metrics`: an async callable returning the server's /metrics text (or
    None).  Raises ScenarioError when the load cannot be sized (no live capacity and no override)."""
    before_text = await metrics() or ""
    capacity, source = None, "--poisson-rate" if cfg.scenario == "poisson" else "--overload-streams"
    direct = cfg.arrival_rate if cfg.scenario == "poisson" else cfg.streams
    if direct is None:
        capacity, source = live_capacity(before_text, cfg.floor)
        if capacity is None:
            raise ScenarioError(source)
    plan = LoadPlan(workload)
    if cfg.scenario == "shift":
        plan = LoadPlan(workload, shifted_workload(workload, cfg.output_factor, cfg.prompt_factor),
                        cfg.shift_after_requests, cfg.shift_after_seconds)
    load: dict = {}
    if cfg.scenario == "poisson":
        rate = cfg.arrival_rate or cfg.factor * capacity_request_rate(max(1, capacity), cfg.floor,
                                                                       workload.output_tokens)
        requests = cfg.requests or (3 * max(1, round(cfg.factor * capacity)) if capacity else POISSON_REQUESTS)
        sent, seconds = await run_open(client, prompts, plan, poisson_schedule(rate, requests, cfg.seed), clock)
        load = {"arrival_rate_per_second": rate}
    else:
        streams = cfg.streams or max(1, round(cfg.factor * max(1, capacity)))
        requests = cfg.requests or 3 * streams
        if plan.after is not None and plan.after_requests is None and plan.after_seconds is None:
            plan = replace(plan, after_requests=requests // 2)  # default: half way
        sent, seconds = await run_closed(client, prompts, plan, streams, requests, clock)
        load = {"streams": streams}
    after_text = await metrics() or ""
    rows = [request_row(s, cfg.floor, cfg.ttft_slo) for s in sent]
    res = {
        "scenario": cfg.scenario,
        "floor_tokens_per_second": cfg.floor,
        "ttft_slo_s": cfg.ttft_slo,
        "capacity_streams": capacity,
        "capacity_source": source,
        "factor": cfg.factor if capacity is not None else None,
        **load,
        **judge(rows, seconds),
        **server_figures(before_text, after_text, cfg.floor, seconds),
        **guard_figures(before_text, after_text),
    }
    if plan.after is not None:
        res["shift"] = {"after_requests": plan.after_requests, "after_seconds": plan.after_seconds,
                        "output_tokens": [plan.workload.output_tokens, plan.after.output_tokens],
                        "prompt_tokens": [plan.workload.input_tokens, plan.after.input_tokens]}
        res["phases"] = {p: judge([r for r in rows if r["phase"] == p], _phase_seconds(rows, p, seconds))
                         for p in (BEFORE, AFTER)}
    res["per_request"] = rows
    return res


def _phase_seconds(rows: list[dict], phase: str, seconds: float) -> float:
    """A shift phase's time base: from its first request sent to the next phase's first (the run's
    end for the last phase)."""
    starts = {p: min((r["sent_s"] for r in rows if r["phase"] == p), default=None) for p in (BEFORE, AFTER)}
    if starts[phase] is None:
        return 0.0
    end = starts[AFTER] if phase == BEFORE and starts[AFTER] is not None else seconds
    return max(0.0, end - starts[phase])


def overload_line(res: dict) -> str:
    """One line for the progress output."""
    def f(v, spec=".0f"):
        return "-" if v is None else format(v, spec)

    def pct(v):
        return f(None if v is None else 100 * v)
    load = (f"{res['streams']} streams" if "streams" in res
            else f"Poisson {res['arrival_rate_per_second']:.2f} req/s")
    guard = (f"; guard cap {f(res['guard_limit'])}, {f(res['guard_requests_held'])} held "
             f"(mean wait {f(res['guard_mean_wait_s'], '.2f')} s)" if res.get("guard_limit") is not None else "")
    slo = (f", {pct(res['slo_met_share'])}% within both SLOs (TTFT {res['ttft_slo_s']:g} s)"
           if res.get("ttft_slo_s") is not None else "")
    server = (f"; server: {pct(res['server_rate_met_share'])}% at the floor of {f(res['server_requests'])}"
              if res.get("server_requests") else "")
    return (f"{res['scenario']} at {load} ({res['capacity_source']}"
            + (f" {res['capacity_streams']} x {res['factor']:g}" if res.get("capacity_streams") is not None else "")
            + f"): {pct(res['rate_met_share'])}% of {res['requests']} requests at >= "
            f"{res['floor_tokens_per_second']:g} tok/s{slo}, rate goodput {f(res['rate_goodput_tokens_per_second'])} "
            f"tok/s, aggregate {f(res['output_tokens_per_second'])} tok/s, TTFT p50 {f(res['ttft_p50_s'], '.2f')} s "
            f"p99 {f(res['ttft_p99_s'], '.2f')} s" + server + guard)
