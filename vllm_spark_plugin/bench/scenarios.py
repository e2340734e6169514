"""Seed 003's two prefill scenarios.

* prefill interference: while N decode streams run, one long uncached prompt arrives.  The decode
  rate of the running streams dips while it is prefilled (seed 003: a 32k-token prompt held Qwen's
  streams at ~4 tok/s for ~16 s, and new short requests waited 13-15 s for a first token).  The dip
  is read from the inter-token timings of the running streams; short probe requests sent during
  the prefill report the TTFT a newcomer sees.
* prefix reuse: the same long document twice: TTFT cold vs cached (seed 003: 17 s -> 0.4 s).

Dip definition: at each instant t the instantaneous rate of a stream is 1 / (the inter-token gap
that contains t); the fleet rate r(t) is the median over streams.  The baseline is the median of
r(t) before the long prompt is sent; the dip is the stretch after it where r(t) is below
`threshold` x baseline (default 0.5), from the first to the last such instant before the long
prompt's first token (plus a few decode steps: the held-up streams' next token).  Depth = the
lowest r(t) in the dip (and as a fraction of the baseline); duration = the length of that stretch.
Beside it, `prefill_window`: each running stream's rate over the whole prefill (tokens that arrived
from sending the long prompt to its first token, over that time), the slowest and the median.

Both scenarios fit their long prompt to the server's `max_model_len` the same way (`fit_prompt_len`,
with the note "long prompt shortened from A to B tokens to fit max_model_len M"); random-word prompts
are then counted with the server's `/tokenize` and cut until they fit.
"""
from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..definitions import median
from .client import OpenAIStreamClient, StreamResult
from .server_info import ServerInfo, tokenize
from .workloads import ContextError, Prompt, PromptFactory, Workload, context_budget

PROBE_PROMPT = "Reply with one word: hello."
MIN_LONG_PROMPT_TOKENS = 16
# Decode streams of the interference scenario: room left for their (short, shipped) prompt.
DECODE_PROMPT_RESERVE = 256

TokenCounter = Callable[[str], Awaitable[int | None]]


class ScenarioError(RuntimeError):
    """A scenario could not be measured (its message says why)."""


@dataclass
class InterferenceConfig:
    streams: int = 8
    long_prompt_tokens: int = 32000
    baseline_seconds: float = 3.0
    tail_seconds: float = 3.0
    probe_interval: float = 0.5
    probe_tokens: int = 4
    threshold: float = 0.5
    timeout: float = 600.0


def fit_prompt_len(requested: int, max_model_len: int | None, output_tokens: int = 1,
                   exact: bool = True) -> tuple[int, str | None]:
    """The long prompt's length in tokens, shortened when `requested` cannot fit `max_model_len`
    (with the note saying so); ContextError when not even a short long prompt fits."""
    if not max_model_len:
        return requested, None
    budget = context_budget(max_model_len, output_tokens, exact)
    if budget < MIN_LONG_PROMPT_TOKENS:
        raise ContextError(f"max_model_len {max_model_len} leaves no room for a long prompt of "
                           f"{MIN_LONG_PROMPT_TOKENS} tokens or more: serve the model with a larger --max-model-len")
    if requested <= budget:
        return requested, None
    return budget, f"long prompt shortened from {requested} to {budget} tokens to fit max_model_len {max_model_len}"


def server_token_counter(info: ServerInfo, api_key: str | None = None) -> TokenCounter | None:
    """Counts text as the server tokenizes it (`/tokenize`); None when the server has no such endpoint."""
    if not info.tokenize_available:
        return None

    async def count(text: str) -> int | None:
        ids = await tokenize(info.endpoint, info.model, text, api_key=api_key)
        return None if ids is None else len(ids)
    return count


class LongPrompts:
    """Fresh long prompts of one fitted length for one scenario run."""

    def __init__(self, client: OpenAIStreamClient, prompts: PromptFactory, requested: int,
                 max_model_len: int | None, count_tokens: TokenCounter | None) -> None:
        self.client, self.prompts, self.count_tokens = client, prompts, count_tokens
        exact = prompts.exact_length(client.token_ids_allowed)
        self.counted = not exact and count_tokens is not None and bool(max_model_len)
        self.tokens, self.note = fit_prompt_len(requested, max_model_len, 1, exact or self.counted)

    async def new(self) -> Prompt:
        """A prompt never sent before; random words are cut until the server counts at most
        `tokens` of them (their length is otherwise only approximate)."""
        prompt = self.prompts.random_prompt(self.tokens, self.client.token_ids_allowed)
        if not self.counted or not isinstance(prompt, str):
            return prompt
        for _ in range(8):
            n = await self.count_tokens(prompt)
            if n is None or n <= self.tokens:
                break
            words = prompt.split(" ")
            prompt = " ".join(words[:max(1, min(len(words) - 1, len(words) * self.tokens // n))])
        return prompt


def rate_timeline(chunk_lists: list[list[float]], t0: float, start: float, end: float, step: float
                  ) -> tuple[list[float], list[float | None]]:
    """Median over streams of the instantaneous rate (1/gap containing t), on a grid of times
    relative to t0.  A stream contributes only between its first and last token."""
    ts: list[float] = []
    rates: list[float | None] = []
    rel = [[x - t0 for x in c] for c in chunk_lists if len(c) >= 2]
    n = int((end - start) / step) + 1
    for i in range(n):
        t = start + i * step
        vals = []
        for c in rel:
            j = bisect.bisect_right(c, t)
            if 0 < j < len(c):
                gap = c[j] - c[j - 1]
                if gap > 0:
                    vals.append(1.0 / gap)
        ts.append(round(t, 6))
        rates.append(median(vals))
    return ts, rates


def window_rates(chunk_lists: list[list[float]], start: float, end: float) -> list[float]:
    """Per-stream rate over [start, end] (absolute times) of the streams that ran through all of it
    (a token before `start` and one after `end`): the tokens that arrived inside / its length.  A
    stream that started or finished inside the window is left out (its rate there is not comparable)."""
    if not end > start:
        return []
    out = []
    for chunks in chunk_lists:
        if len(chunks) < 2 or chunks[0] > start or chunks[-1] < end:
            continue
        inside = bisect.bisect_right(chunks, end) - bisect.bisect_left(chunks, start)
        out.append(inside / (end - start))
    return out


def find_dip(ts: list[float], rates: list[float | None], baseline: float, threshold: float,
             step: float, chunk_lists: list[list[float]], t0: float, until: float | None = None) -> dict:
    """The dip after t=0 (the long prompt sent), searched up to `until` (seconds after t0): later
    slow spells are not the long prompt's doing."""
    end_t = math.inf if until is None else until
    below = [t for t, r in zip(ts, rates)
             if 0 <= t <= end_t and r is not None and r < threshold * baseline]
    if not below:
        return {"detected": False}
    start, end = below[0], below[-1] + step
    inside = [r for t, r in zip(ts, rates) if start <= t < end and r is not None]
    low = min(inside)
    # mean rate of each stream over the dip window (tokens that arrived in it / its length)
    per_stream = [sum(1 for x in c if start <= x - t0 < end) / (end - start) for c in chunk_lists if c]
    return {"detected": True, "start_s": start, "end_s": end, "duration_s": end - start,
            "min_tokens_per_second": low, "depth_ratio": low / baseline,
            "mean_tokens_per_second": median(per_stream)}


async def prefill_interference(client: OpenAIStreamClient, prompts: PromptFactory, workload: Workload,
                               cfg: InterferenceConfig, max_model_len: int | None,
                               count_tokens: TokenCounter | None = None) -> dict:
    notes: list[str] = []
    long_prompts = LongPrompts(client, prompts, cfg.long_prompt_tokens, max_model_len, count_tokens)
    long_len = long_prompts.tokens
    if long_prompts.note:
        notes.append(long_prompts.note)
    # Each decode slot runs requests back to back, so `streams` decode streams are running whatever
    # the decode speed, from before the baseline until the tail ends (then they are cancelled).
    decode_tokens = max(16, min(workload.output_tokens, (max_model_len or 4096) - DECODE_PROMPT_RESERVE))
    if decode_tokens < workload.output_tokens:
        notes.append(f"decode output shortened from {workload.output_tokens} to {decode_tokens} tokens to fit "
                     f"max_model_len {max_model_len}")
    chunk_lists: list[list[float]] = []  # one per decode request, in start order
    decode_errors: list[str] = []
    started = 0

    async def slot() -> None:
        nonlocal started
        while True:
            times: list[float] = []
            chunk_lists.append(times)
            started += 1
            res = await client.stream(prompts.prompt(workload, started - 1, client.token_ids_allowed),
                                      decode_tokens, workload.temperature, chunk_times=times)
            if res.timing.error:
                decode_errors.append(res.timing.error)
                return

    decode = [asyncio.create_task(slot()) for _ in range(cfg.streams)]
    long_task = None
    probes: list[tuple[float, asyncio.Task]] = []
    try:
        deadline = time.perf_counter() + cfg.timeout
        while len(chunk_lists) < cfg.streams or any(len(c) < 2 for c in chunk_lists[:cfg.streams]):
            if decode_errors or time.perf_counter() > deadline:
                raise ScenarioError("decode streams did not start: " + (decode_errors or ["timed out"])[0])
            await asyncio.sleep(0.02)
        await asyncio.sleep(cfg.baseline_seconds)
        baseline_probe = await client.stream(PROBE_PROMPT, cfg.probe_tokens, 0.0)
        long_prompt = await long_prompts.new()
        long_chunks: list[float] = []
        t0 = time.perf_counter()
        long_task = asyncio.create_task(client.stream(long_prompt, 1, 0.0, chunk_times=long_chunks))
        await asyncio.sleep(min(0.05, cfg.probe_interval / 5))
        while not long_chunks and not long_task.done() and time.perf_counter() - t0 < cfg.timeout:
            probes.append((time.perf_counter() - t0,
                           asyncio.create_task(client.stream(PROBE_PROMPT, cfg.probe_tokens, 0.0))))
            slept = 0.0
            while slept < cfg.probe_interval and not long_chunks and not long_task.done():
                await asyncio.sleep(0.01)
                slept += 0.01
        long_res: StreamResult = await long_task
        t_long_done = time.perf_counter() - t0
        probe_results = [(sent, await task) for sent, task in probes]
        await asyncio.sleep(cfg.tail_seconds)
    finally:
        for t in decode + ([long_task] if long_task else []) + [p[1] for p in probes]:
            if not t.done():
                t.cancel()
        await asyncio.gather(*decode, return_exceptions=True)
    if long_res.timing.error:
        raise ScenarioError(f"the long prompt failed: {long_res.timing.error}")
    if decode_errors:
        notes.append(f"{len(decode_errors)} decode stream(s) failed: {decode_errors[0]}")
    gaps = [b - a for c in chunk_lists for a, b in zip(c, c[1:])]
    step = max(0.002, min(0.05, (median(gaps) or 0.02) / 2))
    start = -cfg.baseline_seconds
    end = max((c[-1] for c in chunk_lists if c), default=t0) - t0
    ts, rates = rate_timeline(chunk_lists, t0, start, end, step)
    base_vals = [r for t, r in zip(ts, rates) if t < 0 and r is not None]
    baseline = median(base_vals)
    # The long prompt's prefill ends with its first token; the streams it held up get their next
    # token within a few steps of that.
    ttft = long_res.timing.ttft if long_res.timing.ttft is not None else t_long_done
    until = ttft + max(0.25, 5 * (median(gaps) or 0.05))
    dip = (find_dip(ts, rates, baseline, cfg.threshold, step, chunk_lists, t0, until) if baseline
           else {"detected": False})
    # The seed's question: what the slowest running stream got while the long prompt was prefilled
    # (from sending it to its first token).
    in_window = window_rates(chunk_lists, t0, t0 + ttft)
    probe_rows = [{"sent_s": sent, "ttft_s": r.timing.ttft, "error": r.timing.error,
                   "during_prefill": long_res.timing.first_token is None
                   or (t0 + sent) < long_res.timing.first_token}
                  for sent, r in probe_results]
    during = [p["ttft_s"] for p in probe_rows if p["during_prefill"] and p["ttft_s"] is not None]
    return {
        "scenario": "prefill-interference",
        "decode_streams": cfg.streams,
        "decode_requests": len(chunk_lists),
        "decode_workload": workload.name,
        "long_prompt": {"requested_tokens": long_len, "prompt_tokens": long_res.timing.prompt_tokens,
                        "ttft_s": long_res.timing.ttft, "done_s": t_long_done,
                        "cached_tokens": long_res.cached_tokens},
        "baseline_tokens_per_second": baseline,
        "prefill_window": {"seconds": ttft, "streams": len(in_window),
                           "slowest_tokens_per_second": min(in_window) if in_window else None,
                           "median_tokens_per_second": median(in_window)},
        "threshold": cfg.threshold,
        "dip": dip,
        "baseline_probe_ttft_s": baseline_probe.timing.ttft,
        "probes": probe_rows,
        "probe_ttft_during_prefill_s": {"count": len(during), "median": median(during),
                                        "max": max(during) if during else None},
        "timeline": {"t": ts, "median_rate": rates, "step_s": step},
        "notes": notes,
    }


async def prefix_reuse(client: OpenAIStreamClient, prompts: PromptFactory, doc_tokens: int,
                       repeats: int, max_model_len: int | None, count_tokens: TokenCounter | None = None) -> dict:
    """Each of `repeats` fresh documents is sent twice; TTFT of the first (cold) and second (cached)."""
    notes: list[str] = []
    documents = LongPrompts(client, prompts, doc_tokens, max_model_len, count_tokens)
    n = documents.tokens
    if documents.note:
        notes.append(documents.note)
    pairs = []
    for _ in range(max(1, repeats)):
        doc = await documents.new()
        cold = await client.stream(doc, 1, 0.0)
        cached = await client.stream(doc, 1, 0.0)
        for r in (cold, cached):
            if r.timing.error:
                raise ScenarioError(f"prefix-reuse request failed: {r.timing.error}")
        pairs.append({"prompt_tokens": cold.timing.prompt_tokens, "cold_ttft_s": cold.timing.ttft,
                      "cached_ttft_s": cached.timing.ttft, "cached_tokens_reported": cached.cached_tokens})
    cold_m = median(p["cold_ttft_s"] for p in pairs)
    cached_m = median(p["cached_ttft_s"] for p in pairs)
    if cold_m and cached_m and cached_m > 0.8 * cold_m:
        notes.append("the second request was not much faster: is prefix caching enabled on the server?")
    return {
        "scenario": "prefix-reuse",
        "document_tokens": n,
        "pairs": pairs,
        "cold_ttft_s": cold_m,
        "cached_ttft_s": cached_m,
        "speedup": (cold_m / cached_m) if cold_m and cached_m else None,
        "notes": notes,
    }
