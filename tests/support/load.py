"""Streaming load for the end-to-end tests: N concurrent /v1/completions streams, timed per token."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp

from vllm_spark_plugin.bench.client import ARRIVAL_GAP_SECONDS
from vllm_spark_plugin.definitions import StreamTiming


async def _one(session, base_url, model, prompt, max_tokens) -> tuple[StreamTiming, int]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "ignore_eos": True}
    start = time.monotonic()
    first = last = None
    usage_tokens = 0
    first_tokens = 1
    arrivals = 0
    async with session.post(base_url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                usage_tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                now = time.monotonic()
                if first is None:
                    first = now
                if last is None or now - last > ARRIVAL_GAP_SECONDS:
                    arrivals += 1  # distinct arrivals, as the benchmark counts them
                if arrivals == 1:
                    # the first arrival: every token read with the first chunk (coalesced by the
                    # server, or buffered while this client was not running) took no interval to come
                    first_tokens = max(1, usage_tokens)
                last = now
    return StreamTiming(output_tokens=usage_tokens, start=start, first_token=first, last_token=last,
                        requested_tokens=max_tokens,
                        first_arrival_tokens=first_tokens), arrivals




def run_streams(base_url: str, model: str, concurrency: int, max_tokens: int = 64,
                prompt_prefix: str = "Request") -> list[StreamTiming]:
    """Start `concurrency` streams together; return their timings."""
    return [t for t, _ in run_streams_with_arrivals(base_url, model, concurrency, max_tokens, prompt_prefix)]


def run_streams_with_arrivals(base_url: str, model: str, concurrency: int, max_tokens: int = 64,
                              prompt_prefix: str = "Request") -> list[tuple[StreamTiming, int]]:
    """As run_streams, with each stream's number of distinct arrivals."""
    async def main():
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            coros = [_one(session, base_url, model, f"{prompt_prefix} {i}: write a story about the sea.", max_tokens)
                     for i in range(concurrency)]
            return await asyncio.gather(*coros)
    return asyncio.run(main())


def measured_waves(server, concurrency: int, waves: int, max_tokens: int, tag: str, own_core: bool = True) -> dict:
    """`waves` rounds of `concurrency` streams between two idle scrapes of the server's /metrics, the
    client on a core of its own (support/cores.py) while it times them, unless `own_core` is False (a
    caller that gates on nothing the client times leaves the server all its cores):
    {"before": scrape, "after": scrape, "streams": [StreamTiming, ...], "own_core": bool}."""
    from support.cores import client_core
    from support.scrape import wait_idle
    before = wait_idle(server.metrics_url)
    streams = []
    with (client_core(server) if own_core else contextlib.nullcontext(False)) as own_core:
        for w in range(waves):
            streams += run_streams(server.base_url, server.model, concurrency, max_tokens=max_tokens,
                                   prompt_prefix=f"{tag}c{concurrency}w{w}")
    return dict(before=before, after=wait_idle(server.metrics_url), streams=streams, own_core=own_core)
