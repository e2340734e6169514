"""The concurrency sweep: synchronized waves (seed 003) or closed-loop concurrency.

* waves: all streams of a wave are prepared, then released together (an asyncio barrier); each
  level gets a warm-up wave (discarded) and `trials` measured waves;
* closed loop: `concurrency` workers each keep one request in flight until `requests` requests were
  sent or `duration` seconds passed (what `vllm bench serve --max-concurrency` does).

After a trial with failed requests the endpoint is probed: a server that stopped answering (or a
trial where every request failed) ends the run with `ServerGone`; the completed trials and points
are already in the CSV.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..definitions import LatencySLO
from .adaptive import PHASE_LADDER, AdaptiveSearch, Decision, Observation, SearchConfig
from .client import OpenAIStreamClient, StreamResult
from .progress import Progress
from .results import CsvWriter, CurveKey, Row, RunRecord, stream_rows
from .server_info import ServerInfo, reachable
from .stats import summarize
from .workloads import PromptFactory, Workload

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)


class ServerGone(RuntimeError):
    """The server stopped answering (or failed every request) in the middle of the run."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class SweepConfig:
    levels: tuple[int, ...] = DEFAULT_LEVELS
    trials: int = 3
    warmup: bool = True
    mode: str = "waves"  # waves | closed-loop
    requests: int | None = None  # closed loop: per trial (default 4 x concurrency)
    duration: float | None = None  # closed loop: seconds per trial (instead of a request count)
    include_short: bool = False
    api_key: str | None = None
    slo: LatencySLO | None = None  # judge every request against it (goodput, attainment)
    search: SearchConfig | None = None  # --levels auto: the levels come from an adaptive search

    @property
    def top_level(self) -> int:
        return self.search.budget.max_concurrency if self.search else max(self.levels)

    def requests_for(self, concurrency: int) -> int | None:
        """Closed loop: requests per trial (None with a duration: as many as fit in it)."""
        if self.duration:
            return self.requests
        return self.requests or 4 * concurrency

    def units(self, n_curves: int) -> int:
        """Progress units (warm-ups and trials); with a search, its point budget bounds the levels."""
        levels = self.search.budget.max_points if self.search else len(self.levels)
        return n_curves * levels * (self.trials + (1 if self.warmup else 0))


async def run_wave(client: OpenAIStreamClient, prompts: PromptFactory, workload: Workload,
                   concurrency: int) -> tuple[list[StreamResult], float]:
    """One synchronized wave: every stream is prepared, then all are released at once."""
    barrier = asyncio.Event()
    tasks = [asyncio.create_task(client.stream(prompts.prompt(workload, i, client.token_ids_allowed),
                                               workload.output_tokens, workload.temperature,
                                               start_event=barrier))
             for i in range(concurrency)]
    await asyncio.sleep(0)  # every task runs up to the barrier (payloads are built by then)
    t0 = time.perf_counter()
    barrier.set()
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - t0


async def run_closed_loop(client: OpenAIStreamClient, prompts: PromptFactory, workload: Workload,
                          concurrency: int, requests: int | None, duration: float | None
                          ) -> tuple[list[StreamResult], float]:
    """Keep `concurrency` requests in flight until `requests` were sent or `duration` passed.

    With a request count, every prompt is built before the clock starts (as `vllm bench serve`
    does): exact-length tokenizer prompts cost milliseconds of client CPU each, which would
    otherwise sit between one request's end and the next one's start."""
    results: list[StreamResult] = []
    issued = 0
    ready = ([prompts.prompt(workload, i, client.token_ids_allowed) for i in range(requests)]
             if requests is not None else None)
    t0 = time.perf_counter()
    stop_at = t0 + duration if duration else None

    async def worker() -> None:
        nonlocal issued
        while (requests is None or issued < requests) and (stop_at is None or time.perf_counter() < stop_at):
            index = issued
            issued += 1
            prompt = ready[index] if ready is not None else prompts.prompt(workload, index, client.token_ids_allowed)
            results.append(await client.stream(prompt, workload.output_tokens, workload.temperature))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - t0


@dataclass
class EndpointTarget:
    info: ServerInfo
    label: str
    prompts: PromptFactory
    client_kwargs: dict = field(default_factory=dict)


class SweepRunner:
    def __init__(self, cfg: SweepConfig, record: RunRecord, csv_writer: CsvWriter, progress: Progress,
                 streams_writer: CsvWriter | None = None) -> None:
        self.cfg = cfg
        self.record = record
        self.csv = csv_writer
        self.streams_csv = streams_writer
        self.progress = progress

    async def run_target(self, target: EndpointTarget, workloads: list[Workload]) -> None:
        info = target.info
        max_conn = self.cfg.top_level + 8
        async with OpenAIStreamClient(info.endpoint, info.model, max_connections=max_conn,
                                      api_key=self.cfg.api_key, **target.client_kwargs) as client:
            for workload in workloads:
                key = CurveKey(target.label, workload.name, info.endpoint, info.model)
                if self.cfg.search is not None:
                    await self._search(client, target, key, workload)
                    continue
                for i, level in enumerate(self.cfg.levels, 1):
                    await self._point(client, target, key, workload, level,
                                      Decision(i, level, PHASE_LADDER, "given by --levels"))

    async def _search(self, client, target: EndpointTarget, key: CurveKey, workload: Workload) -> None:
        """--levels auto: measure the level the search asks for until it stops (adaptive.py).  The
        outcome is kept in the record after every point, so a run that ends early still says how far
        the search got."""
        search = AdaptiveSearch(self.cfg.search)
        observations: list[Observation] = []
        elapsed = 0.0
        try:
            while True:
                d = search.decide(observations, elapsed)
                self.record.searches[key] = search.outcome(observations)
                if d.concurrency is None:
                    self.progress.note(f"auto {key.label} {key.workload}: stop after {len(observations)} "
                                       f"point(s): {d.reason}")
                    return
                self.progress.note(f"auto {key.label} {key.workload}: point {d.step} at c={d.concurrency} "
                                   f"({d.phase}): {d.reason}")
                t0 = time.perf_counter()
                point = await self._point(client, target, key, workload, d.concurrency, d)
                seconds = time.perf_counter() - t0
                elapsed += seconds
                observations.append(observation(point, self.record.trials, seconds))
        finally:
            self.record.searches[key] = search.outcome(observations)

    async def _trial(self, client, target: EndpointTarget, workload: Workload, level: int):
        if self.cfg.mode == "closed-loop":
            return await run_closed_loop(client, target.prompts, workload, level,
                                         self.cfg.requests_for(level), self.cfg.duration)
        return await run_wave(client, target.prompts, workload, level)

    async def _check(self, target: EndpointTarget, results: list[StreamResult], where: str) -> None:
        failed = [r.timing for r in results if r.timing.error is not None]
        if not failed:
            return
        reason = await reachable(target.info.endpoint, api_key=self.cfg.api_key)
        if reason is not None:
            raise ServerGone(f"{target.info.endpoint} stopped answering during {where} ({reason}); "
                             f"last request error: {failed[0].error}")
        if len(failed) == len(results):
            raise ServerGone(f"every request of {where} failed on {target.info.endpoint}: {failed[0].error}")
        self.progress.note(f"warning: {len(failed)}/{len(results)} requests of {where} failed: {failed[0].error}")

    def _row(self, row_type: str, key: CurveKey, target: EndpointTarget, workload: Workload,
             level: int, trial: int, metrics, chosen: Decision) -> Row:
        return Row(row_type=row_type, key=key, concurrency=level, trial=trial, metrics=metrics, chosen=chosen,
                   date=now_iso(), mode=self.cfg.mode, api=target.client_kwargs.get("api", "chat"),
                   requested_output_tokens=workload.output_tokens, temperature=workload.temperature,
                   ignore_eos=target.client_kwargs.get("ignore_eos", True),
                   engine_version=target.info.engine_version, max_model_len=target.info.max_model_len,
                   recipe=target.info.recipe(), run_id=self.record.run_id)

    async def _point(self, client, target: EndpointTarget, key: CurveKey, workload: Workload, level: int,
                     chosen: Decision) -> Row:
        name = f"{key.label} {workload.name} c={level}"
        if self.cfg.warmup:
            self.progress.start(f"{name} warm-up")
            if self.cfg.mode == "closed-loop":  # one request per slot, like the warm-up wave
                results, _ = await run_closed_loop(client, target.prompts, workload, level, level, None)
            else:
                results, _ = await self._trial(client, target, workload, level)
            await self._check(target, results, f"{name} warm-up")
            self.progress.advance("warm-up done")
        trials: list[list[StreamResult]] = []
        durations: list[float] = []
        for t in range(1, self.cfg.trials + 1):
            self.progress.start(f"{name} trial {t}/{self.cfg.trials}")
            results, duration = await self._trial(client, target, workload, level)
            await self._check(target, results, f"{name} trial {t}")
            trials.append(results)
            durations.append(duration)
            m = summarize([results], [duration], self.cfg.include_short, self.cfg.slo)
            row = self._row("trial", key, target, workload, level, t, m, chosen)
            self.record.trials.append(row)
            self.csv.write(row)
            if self.streams_csv is not None:
                self.streams_csv.write_many(stream_rows(key, level, t, results, self.cfg.slo))
            self.progress.advance(_headline(m))
        point = self._row("point", key, target, workload, level, len(trials),
                          summarize(trials, durations, self.cfg.include_short, self.cfg.slo), chosen)
        self.record.points.append(point)
        self.csv.write(point)
        if point.metrics.bunched_streams:
            self.progress.note(f"note: {name}: {point.metrics.bunched_streams} stream(s) arrived in a few bursts "
                               f"(the server held output back; counted in bunched_streams, left out of the "
                               f"per-stream rates)")
        if point.metrics.short_streams:
            how = ("included in the per-stream rates (--include-short)" if self.cfg.include_short
                   else "left out of the per-stream rates")
            self.progress.note(f"note: {name}: {point.metrics.short_streams} stream(s) ended before "
                               f"{workload.output_tokens} tokens (counted in short_streams, {how})")
        return point


def observation(point: Row, trials: list[Row], seconds: float) -> Observation:
    """A measured point as the adaptive search sees it (its trials give the evidence per trial)."""
    mine = [t for t in trials if t.key == point.key and t.concurrency == point.concurrency]
    m = point.metrics
    return Observation(concurrency=point.concurrency, per_stream_tps=m.per_stream_median_tps,
                       aggregate_tps=m.aggregate_tps, ttft_p50_s=m.ttft_p50_s, slo_attainment=m.slo_attainment,
                       seconds=seconds, trial_rates=tuple(t.metrics.per_stream_median_tps for t in mine),
                       trial_attainments=tuple(t.metrics.slo_attainment for t in mine))


def _headline(m) -> str:
    def f(x, spec):
        return "n/a" if x is None else format(x, spec)
    return (f"per-stream {f(m.per_stream_median_tps, '.1f')} tok/s, aggregate {f(m.aggregate_tps, '.1f')} tok/s, "
            f"TTFT p50 {f(m.ttft_p50_s, '.3f')} s" + (f", {m.errors} errors" if m.errors else "")
            + (f", {m.short_streams} short" if m.short_streams else "")
            + (f", {m.bunched_streams} bunched" if m.bunched_streams else "")
            + (f", SLO attainment {m.slo_attainment:.1%}, goodput {f(m.goodput_tps, '.1f')} tok/s"
               if m.slo_attainment is not None else ""))
