"""Closed-loop streaming load for the live dashboard tests: N workers, each sending one streaming
/v1/completions request after another until a deadline; workers start staggered so the engine sees
batch sizes from 1 up to N (the step-time fit needs more than one batch size)."""
from __future__ import annotations

import asyncio
import time

import aiohttp


async def _worker(session: aiohttp.ClientSession, url: str, model: str, worker: int, deadline: float,
                  max_tokens: int, delay: float, counts: dict) -> None:
    await asyncio.sleep(delay)
    n = 0
    while time.monotonic() < deadline:
        body = {"model": model, "prompt": f"Worker {worker} request {n}: tell me about the sea.",
                "max_tokens": max_tokens, "temperature": 0.0, "stream": True, "ignore_eos": True}
        async with session.post(url, json=body) as resp:
            resp.raise_for_status()
            async for raw in resp.content:
                if raw.startswith(b"data:") and b"[DONE]" not in raw:
                    counts["chunks"] += 1
        counts["requests"] += 1
        n += 1


def drive(base_urls: list[str], model: str, seconds: float = 20.0, concurrency: int = 8,
          max_tokens: int = 32, stagger: float = 1.0) -> dict:
    """Run `concurrency` workers per base URL for `seconds`; returns {"requests": n, "chunks": n}."""
    async def main() -> dict:
        counts = {"requests": 0, "chunks": 0}
        deadline = time.monotonic() + seconds
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=seconds + 120)) as session:
            await asyncio.gather(*[
                _worker(session, base.rstrip("/") + "/v1/completions", model, w, deadline, max_tokens,
                        min(w * stagger, seconds / 2), counts)
                for base in base_urls for w in range(concurrency)])
        return counts
    return asyncio.run(main())
