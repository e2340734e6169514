"""Per-output cost of the delivery clock (`hooks/delivery.py`) in the API server.

The OpenAI server iterates `AsyncLLM.generate` once per output of each request.  Here one request's
outputs (real vLLM `RequestOutput`s, one new token each, DELTA, the last one finished) come from an
async generator standing in for vLLM's, iterated either directly or through the plugin's wrapper
with its sink recording into a real exporter (the per-stream histogram and the SLO counters, on a
registry of its own).  The difference per output is the plugin's cost; times 256 is its cost per
engine step with 256 streams.  Alternating, median of several runs.

    python benchmarks/delivery_overhead.py [--outputs 256] [--requests 200] [--runs 7]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
RESULTS = Path(__file__).resolve().parent / "results"


def make_outputs(n: int):
    from vllm.outputs import CompletionOutput, RequestOutput
    return [RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1, 2, 3], prompt_logprobs=None,
                          outputs=[CompletionOutput(index=0, text="x", token_ids=[7], cumulative_logprob=None,
                                                    logprobs=None)],
                          finished=i == n - 1) for i in range(n)]


async def vllm_like(self, prompt, sampling_params, request_id, *, outputs):
    for out in outputs:
        yield out


async def consume(gen) -> int:
    n = 0
    async for _ in gen:
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outputs", type=int, default=256, help="outputs (tokens) per request")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args(argv)

    from prometheus_client import CollectorRegistry
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from vllm_spark_plugin.hooks import delivery
    from vllm_spark_plugin.metrics.exporter import Exporter

    outputs = make_outputs(a.outputs)
    params = SamplingParams(output_kind=RequestOutputKind.DELTA, max_tokens=a.outputs)
    st = Exporter("delivery-bench", registry=CollectorRegistry()).engine(0)
    delivery._ORIGINAL, delivery._sink = vllm_like, st.record_delivered

    async def run(wrapped: bool) -> float:
        fn = delivery.generate if wrapped else vllm_like
        t0 = time.perf_counter()
        for _ in range(a.requests):
            await consume(fn(None, "p", params, "r", outputs=outputs))
        return (time.perf_counter() - t0) / (a.requests * a.outputs)

    base, wrapped = [], []
    for _ in range(a.runs):
        base.append(asyncio.run(run(False)))
        wrapped.append(asyncio.run(run(True)))
    b, w = statistics.median(base) * 1e6, statistics.median(wrapped) * 1e6
    res = {"outputs_per_request": a.outputs, "requests": a.requests, "runs": a.runs,
           "bare_us_per_output": b, "wrapped_us_per_output": w, "plugin_us_per_output": w - b,
           "plugin_us_per_step_at_256_streams": (w - b) * 256}
    print(f"per output: bare {b:.2f} us, through the delivery wrapper {w:.2f} us: plugin {w - b:.2f} us "
          f"({(w - b) * 256:.0f} us per engine step at 256 streams)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "delivery_overhead.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
