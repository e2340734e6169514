"""Per-step cost of the plugin's stat logger against vLLM's own PrometheusStatLogger.

Both loggers are fed the same sequence of vLLM stats objects (real `SchedulerStats`,
`IterationStats`, `FinishedRequestStats`), made by replaying a continuous-batching schedule with
N running streams: every step each stream gets a token, requests finish after `--output-len` tokens
and are replaced at once (so TTFTs and finished requests arrive at the steady-state rate).  The
scheduler hook's record for the step (which reaches the plugin on its own channel) is recorded too,
as in production: the plugin's cost per step is `record()` plus the hook record, handed to the
channel reader's public `deliver` in the engine core's batches of 64 records (as the reader thread
receives them).  Each logger gets
its own copy of the stream; timings are medians of several runs.

    python benchmarks/record_overhead.py [--streams 1 64 256] [--steps 2000] [--runs 7]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def make_stats(n: int, steps: int, output_len: int):
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

    out = []
    finish_acc = 0.0
    for step in range(steps):
        s = SchedulerStats(num_running_reqs=n, num_waiting_reqs=0, kv_cache_usage=min(1.0, n / 512))
        hook = (0, 20_000 + 150 * n, 0, 0, n, n, 4096 - 4 * n, 4097, -1)  # a metrics.step.HookStep's fields
        it = IterationStats()
        it.num_generation_tokens = n
        it.inter_token_latencies_iter = [0.02 + 0.00015 * n] * n
        finish_acc += n / output_len
        k = int(finish_acc)
        finish_acc -= k
        for _ in range(k):
            it.finished_requests.append(FinishedRequestStats(
                finish_reason=FinishReason.LENGTH, e2e_latency=5.0, num_prompt_tokens=128,
                num_generation_tokens=output_len, max_tokens_param=output_len, queued_time=0.01,
                prefill_time=0.1, inference_time=5.0, decode_time=4.9,
                mean_time_per_output_token=4.9 / (output_len - 1)))
            it.time_to_first_tokens_iter.append(0.11)
            it.max_num_generation_tokens_iter.append(output_len)
            it.n_params_iter.append(1)
        out.append((s, it, hook))
    return out


def vllm_config(model: str):
    from vllm.engine.arg_utils import EngineArgs
    return EngineArgs(model=model, enforce_eager=True, max_model_len=2048, dtype="bfloat16").create_engine_config()


def time_logger(logger, stats, reader=None) -> float:
    """us per step; `reader`: the plugin's channel reader, handed the hook's records of the steps."""
    from vllm_spark_plugin.metrics.step import HookStep
    batches = []  # the hook's records, packed as the engine core sends them (64 a datagram)
    if reader is not None:
        for i in range(0, len(stats), 64):
            batches.append(b"".join(HookStep(*h).pack() for _, _, h in stats[i:i + 64]))
    t0 = time.perf_counter_ns()
    for k, (s, it, _hook) in enumerate(stats):
        logger.record(s, it, None, 0)
        if reader is not None and k % 64 == 63:
            reader.deliver(batches[k // 64])
    if reader is not None and len(stats) % 64:
        reader.deliver(batches[-1])
    return (time.perf_counter_ns() - t0) / len(stats) / 1000.0  # us per step


def loggers():
    """vLLM's own PrometheusStatLogger and the plugin's, for the tiny model's config, in this process's
    registry; the plugin's as in `vllm serve` (a run directory, so the hook's records count the
    batches) with its telemetry thread stopped (the loggers' own work is what is measured)."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    from vllm_spark_plugin.hooks import channel
    from vllm_spark_plugin.hooks.stat_logger import SparkStatLogger
    from vllm_spark_plugin.testbed.tiny_model import ensure_tiny_model

    os.environ.setdefault(channel.RUN_DIR_ENV, channel.ensure_run_dir())
    cfg = vllm_config(str(ensure_tiny_model()))
    cfg.cache_config.num_gpu_blocks = 4097
    theirs = PrometheusStatLogger(cfg, engine_indexes=[0])
    ours = SparkStatLogger(cfg, engine_index=0)
    ours.exporter.stop_background()
    assert ours.exporter.hook_steps
    return theirs, ours


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "record_overhead.json"))
    args = p.parse_args(argv)

    from vllm_spark_plugin.hooks import channel

    theirs, ours = loggers()
    reader = channel.StepReader("unbound", ours.record_step, ours.count_invalid, print)  # never started

    rows = []
    print(f"{'streams':>8} {'vLLM us/step':>13} {'plugin us/step':>15} {'ratio':>7}", flush=True)
    for n in args.streams:
        base = make_stats(n, args.steps, args.output_len)
        v_times, p_times = [], []
        for _ in range(args.runs):
            # alternate, on fresh copies, so drift and caches hit both alike
            v_times.append(time_logger(theirs, copy.deepcopy(base)))
            p_times.append(time_logger(ours, copy.deepcopy(base), reader))
        v, pl = statistics.median(v_times), statistics.median(p_times)
        rows.append({"streams": n, "vllm_us_per_step": round(v, 2), "plugin_us_per_step": round(pl, 2),
                     "ratio": round(pl / v, 3), "runs": args.runs, "steps": args.steps})
        print(f"{n:>8} {v:>13.2f} {pl:>15.2f} {pl / v:>7.3f}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rows": rows, "python": sys.version.split()[0]}, indent=2) + "\n")
    ok = all(r["ratio"] <= 0.5 for r in rows) and all(r["plugin_us_per_step"] <= 50 for r in rows if r["streams"] == 256)
    print("targets (ratio <= 0.5, <= 50 us at 256 streams):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
