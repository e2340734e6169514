"""Peer check on a live server: `vllm bench serve` vs `vllm-spark bench --mode closed-loop`, same load.

Same load on the same server: 128-token random text prompts built with the model's tokenizer, 64
output tokens with ignore_eos, greedy sampling, the same request count, at --max-concurrency 1 and
8, each client in its own process on the plain asyncio event loop.  Both sides define output
throughput the same way (output tokens / wall time of the run: vllm bench's `output_throughput`,
this tool's `output_tps`); that the definitions agree is tested deterministically on recorded
streams (tests/contract/test_peer_definitions.py).  This script measures how close the two
clients come on real timing, which depends on the machine: it is a benchmark, not a gate.

Protocol: paired rounds, each runs both sides back to back, the order alternating (ABBA); the
figure is the median over rounds of the per-round ratio (ours / vllm bench), since the machine's
speed drifts over minutes and a round's pair sees the same drift.  TTFT: the median over every
request of every round (this tool's `streams.csv`, vllm bench's `--save-detailed` TTFTs), leaving
out on both sides the requests delivered in one burst (this tool's `bunched` rule; vllm bench's
inter-chunk gaps give its distinct arrivals): their first-token time is the test bed's stall.
For reference the old gate's bounds are reported: |ratio - 1| <= 10%, TTFT within 20%.

Run: .venv/bin/python benchmarks/peer_check.py [--rounds 6] [--concurrency 1 8] [--endpoint URL --model NAME --tokenizer DIR]
Without --endpoint it starts a CPU `vllm serve` of the tiny test model with the plugin (1-3 minutes).
Writes benchmarks/results/peer_check.json and prints the per-round figures side by side.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_spark_plugin.bench.client import ARRIVAL_GAP_SECONDS, is_bunched

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PY = sys.executable
INPUT_LEN, OUTPUT_LEN = 128, 64
REQUESTS = {1: 32, 8: 160}  # runs of a few seconds each
TPS_BOUND, TTFT_BOUND = 0.10, 0.20  # the bounds the check once had as a test, reported for reference


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    tokenizer: str


def _requests(c: int) -> int:
    return REQUESTS.get(c, 20 * c)


def run_ours(t: Target, c: int, out: Path) -> dict:
    # In its own process, as vllm bench runs: this process's threads must not slow one side.
    cmd = [PY, "-m", "vllm_spark_plugin.cli", "bench", "--quiet", "--endpoint", t.base_url,
           "--model", t.model, "--api", "completions", "--workload", "random", "--random-input-len", str(INPUT_LEN),
           "--tokenizer", t.tokenizer,  # exact-length text prompts, as vllm bench sends
           "--output-tokens", str(OUTPUT_LEN), "--mode", "closed-loop", "--levels", str(c),
           "--requests", str(_requests(c)), "--trials", "1", "--out", str(out),
           "--event-loop", "asyncio"]  # vllm bench's loop: the check compares clients, not event loops
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm-spark bench exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    with open(out / "sweep.csv", newline="") as fh:
        (p,) = [r for r in csv.DictReader(fh) if r["row_type"] == "point"]
    if int(p["errors"]) or int(p["output_tokens"]) != _requests(c) * OUTPUT_LEN:
        raise RuntimeError(f"vllm-spark bench: {p['errors']} errors, {p['output_tokens']} output tokens")
    with open(out / "streams.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {"output_tps": float(p["output_tps"]), "ttfts": [float(r["ttft_s"]) for r in rows if r["bunched"] != "1"]}


def run_vllm_bench(t: Target, c: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [PY, "-m", "vllm_spark_plugin.bench.vllm_bench_wrapper", "bench", "serve",
           "--backend", "openai", "--base-url", t.base_url, "--endpoint", "/v1/completions",
           "--model", t.model, "--tokenizer", t.tokenizer, "--dataset-name", "random",
           "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
           "--num-prompts", str(_requests(c)), "--max-concurrency", str(c), "--num-warmups", str(c),
           "--ignore-eos", "--temperature", "0",  # greedy, as this tool's random workload asks
           "--disable-tqdm", "--save-result", "--result-dir", str(out),
           "--result-filename", "result.json", "--save-detailed"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    res = json.loads((out / "result.json").read_text())
    if res["completed"] != _requests(c) or res["total_output_tokens"] != _requests(c) * OUTPUT_LEN:
        raise RuntimeError(f"vllm bench serve: {res['completed']} completed, {res['total_output_tokens']} tokens")
    # The same bunching rule as this tool's (distinct arrivals: chunks more than 0.5 ms apart).
    bunched = [is_bunched(n, 1 + sum(1 for x in itl if x > ARRIVAL_GAP_SECONDS))
               for n, itl in zip(res["output_lens"], res["itls"])]
    return {"output_tps": res["output_throughput"], "ttfts": [x for x, b in zip(res["ttfts"], bunched) if not b]}


def compare(t: Target, c: int, rounds: int, work: Path) -> dict:
    ours, theirs = [], []
    for r in range(rounds):
        sides = [lambda: ours.append(run_ours(t, c, work / f"c{c}-ours-{r}")),
                 lambda: theirs.append(run_vllm_bench(t, c, work / f"c{c}-vllm-{r}"))]
        for side in (sides if r % 2 == 0 else sides[::-1]):  # ABBA order
            side()
        print(f"c={c} round {r + 1}/{rounds}: vllm-spark {ours[-1]['output_tps']:.1f} tok/s, "
              f"vllm bench {theirs[-1]['output_tps']:.1f} tok/s, ratio "
              f"{ours[-1]['output_tps'] / theirs[-1]['output_tps']:.3f}", file=sys.stderr, flush=True)
    ratios = [o["output_tps"] / v["output_tps"] for o, v in zip(ours, theirs)]
    ttft_ours = statistics.median(x for o in ours for x in o["ttfts"])
    ttft_theirs = statistics.median(x for v in theirs for x in v["ttfts"])
    ratio = statistics.median(ratios)
    return {"concurrency": c, "requests_per_run": _requests(c), "rounds": rounds,
            "output_tps_ours": [o["output_tps"] for o in ours], "output_tps_vllm_bench": [v["output_tps"] for v in theirs],
            "ratios": ratios, "median_ratio": ratio, "ratio_min": min(ratios), "ratio_max": max(ratios),
            "median_ttft_ours_s": ttft_ours, "median_ttft_vllm_bench_s": ttft_theirs,
            "ttft_rel_diff": abs(ttft_ours - ttft_theirs) / ttft_theirs,
            "within_old_bounds": abs(ratio - 1) <= TPS_BOUND and abs(ttft_ours - ttft_theirs) / ttft_theirs <= TTFT_BOUND}


def _print_table(rows: list[dict]) -> None:
    for r in rows:
        print(f"\nc={r['concurrency']} ({r['requests_per_run']} requests per run, {r['rounds']} rounds, ABBA)")
        print(f"{'round':>5} {'vllm-spark tok/s':>17} {'vllm bench tok/s':>17} {'ratio':>7}")
        for i, (a, b, q) in enumerate(zip(r["output_tps_ours"], r["output_tps_vllm_bench"], r["ratios"]), 1):
            print(f"{i:>5} {a:>17.1f} {b:>17.1f} {q:>7.3f}")
        print(f"median ratio {r['median_ratio']:.3f} (range {r['ratio_min']:.3f} .. {r['ratio_max']:.3f}); "
              f"median TTFT vllm-spark {r['median_ttft_ours_s'] * 1000:.1f} ms, vllm bench "
              f"{r['median_ttft_vllm_bench_s'] * 1000:.1f} ms ({r['ttft_rel_diff']:.0%} apart); "
              f"within the old 10%/20% bounds: {'yes' if r['within_old_bounds'] else 'no'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="paired rounds per concurrency (default 6)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--endpoint", help="an OpenAI-compatible server to use (default: start the tiny CPU server)")
    ap.add_argument("--model", help="served model name (with --endpoint)")
    ap.add_argument("--tokenizer", help="tokenizer folder (with --endpoint; default: the tiny test model)")
    args = ap.parse_args(argv)
    if args.endpoint and not args.model:
        ap.error("--endpoint needs --model")

    from vllm_spark_plugin.testbed.server import VllmServer, prioritize_client
    from vllm_spark_plugin.testbed.tiny_model import ensure_tiny_model
    server = None
    if args.endpoint:
        target = Target(args.endpoint.rstrip("/"), args.model, args.tokenizer or str(ensure_tiny_model()))
    else:
        model = ensure_tiny_model()
        server = VllmServer(model_path=str(model), log_path=Path(tempfile.gettempdir()) / "peer-check-server.log")
        print(f"starting the CPU vLLM server (log: {server.log_path})", file=sys.stderr, flush=True)
        server.start(timeout=900)
        server.prioritize_frontend()  # both clients see token arrivals as they happen, where permitted
        target = Target(server.base_url, server.model, str(model))
    prioritize_client()  # inherited by both clients' processes, where permitted
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [compare(target, c, args.rounds, Path(tmp)) for c in args.concurrency]
    finally:
        if server is not None:
            server.stop()
    result = {"rows": rows, "input_tokens": INPUT_LEN, "output_tokens": OUTPUT_LEN,
              "server": "tiny CPU vLLM (testbed)" if server is not None else target.base_url,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                          "root": os.geteuid() == 0},
              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "peer_check.json").write_text(json.dumps(result, indent=2) + "\n")
    _print_table(rows)
    print(f"written: {RESULTS / 'peer_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
