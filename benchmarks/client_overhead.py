"""Client CPU cost of streaming: `vllm-spark bench` vs `vllm bench serve`, 256 concurrent streams.

Both clients run as child processes against the same fast local fake SSE server
(`vllm_spark_plugin.testbed.fake_server`, in its own process so its CPU is not counted), with the
same load: 256 streams kept in flight, 32-token random prompts on /v1/completions, a fixed number
of output tokens per request, usage from the server.  The CPU seconds (user + system) of each
client process come from `os.wait4` (the child's own rusage).

`vllm-spark bench` runs on uvloop when it is installed (it comes with vLLM); the plain-asyncio
figure (`--event-loop asyncio`) is measured too.  Start-up costs differ a lot (`vllm bench serve` imports torch and vLLM; `vllm-spark bench` renders
its plots and report at the end), so each client runs at two output lengths and the figure of
merit is the marginal cost: (CPU(long) - CPU(short)) / (tokens(long) - tokens(short)) per 1,000
tokens.  Totals per run are reported as well.  Target: ratio (ours / vllm bench) <= 1.

Run: .venv/bin/python benchmarks/client_overhead.py [--streams 256] [--short 32] [--long 512]
Writes benchmarks/results/client_overhead.json and prints a table.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PY = sys.executable


def start_fake(alpha: float, beta: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([PY, "-m", "vllm_spark_plugin.testbed.fake_server", "--port", "0",
                             "--alpha", str(alpha), "--beta", str(beta), "--max-model-len", "1000000",
                             "--max-batch", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    line = proc.stdout.readline().strip()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[-1]


def run_child(cmd: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(CPU seconds of the child, wall seconds, combined output)."""
    log = tempfile.TemporaryFile(mode="w+")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    log.seek(0)
    out = log.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {proc.returncode}:\n{out[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall, out


def ours(url: str, streams: int, out_tokens: int, work: Path, loop: str = "auto") -> tuple[float, float, int]:
    out = work / f"ours-{loop}-{out_tokens}"
    cmd = [PY, "-m", "vllm_spark_plugin.cli", "bench", "--endpoint", url, "--api", "completions", "--event-loop", loop,
           "--workload", "random", "--random-input-len", "32", "--output-tokens", str(out_tokens),
           "--mode", "closed-loop", "--levels", str(streams), "--requests", str(streams),
           "--trials", "1", "--no-warmup", "--quiet", "--out", str(out)]
    cpu, wall, _ = run_child(cmd)
    with open(out / "sweep.csv", newline="") as fh:
        point = [r for r in csv.DictReader(fh) if r["row_type"] == "point"][0]
    if int(point["errors"]):
        raise RuntimeError(f"vllm-spark bench had errors: {point['first_error']}")
    return cpu, wall, int(point["output_tokens"])


def vllm_bench(url: str, streams: int, out_tokens: int, work: Path, tokenizer: Path) -> tuple[float, float, int]:
    name = f"vllm-{out_tokens}.json"
    cmd = [PY, "-m", "vllm_spark_plugin.bench.vllm_bench_wrapper", "bench", "serve", "--backend", "openai",
           "--base-url", url, "--endpoint", "/v1/completions", "--model", "fake-model",
           "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", "32",
           "--random-output-len", str(out_tokens), "--num-prompts", str(streams),
           "--max-concurrency", str(streams), "--ignore-eos", "--disable-tqdm",
           "--save-result", "--result-dir", str(work), "--result-filename", name]
    cpu, wall, _ = run_child(cmd)
    res = json.loads((work / name).read_text())
    if res.get("failed"):
        raise RuntimeError(f"vllm bench serve: {res['failed']} failed requests")
    return cpu, wall, int(res["total_output_tokens"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--short", type=int, default=32, help="output tokens per request, short run")
    ap.add_argument("--long", type=int, default=512, help="output tokens per request, long run")
    ap.add_argument("--repeats", type=int, default=2, help="runs per client and length (median taken)")
    ap.add_argument("--alpha", type=float, default=0.02, help="fake server step cost (s)")
    ap.add_argument("--beta", type=float, default=0.0, help="fake server per-stream step cost (s)")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="tokenizer folder for vllm bench (default: the tiny test model, built if missing)")
    args = ap.parse_args(argv)

    from vllm_spark_plugin.testbed.tiny_model import ensure_tiny_model
    tokenizer = ensure_tiny_model(args.tokenizer) if args.tokenizer is None or not args.tokenizer.exists() \
        else args.tokenizer
    fake, url = start_fake(args.alpha, args.beta)
    rows: dict[str, dict] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for client, fn in (("vllm-spark bench", lambda n: ours(url, args.streams, n, work)),
                               ("vllm-spark (asyncio)", lambda n: ours(url, args.streams, n, work, "asyncio")),
                               ("vllm bench serve", lambda n: vllm_bench(url, args.streams, n, work, tokenizer))):
                runs = {}
                for n in (args.short, args.long):
                    samples = [fn(n) for _ in range(args.repeats)]
                    runs[n] = {"cpu_s": statistics.median(s[0] for s in samples),
                               "wall_s": statistics.median(s[1] for s in samples),
                               "tokens": samples[0][2], "cpu_samples": [s[0] for s in samples]}
                    print(f"{client:>18}: {args.streams} streams x {n} tokens: CPU {runs[n]['cpu_s']:.2f} s, "
                          f"wall {runs[n]['wall_s']:.1f} s, {runs[n]['tokens']} tokens", file=sys.stderr)
                d_cpu = runs[args.long]["cpu_s"] - runs[args.short]["cpu_s"]
                d_tok = runs[args.long]["tokens"] - runs[args.short]["tokens"]
                rows[client] = {"runs": {str(k): v for k, v in runs.items()},
                                "marginal_cpu_s_per_1k_tokens": 1000.0 * d_cpu / d_tok,
                                "total_cpu_s_per_1k_tokens_long_run":
                                    1000.0 * runs[args.long]["cpu_s"] / runs[args.long]["tokens"]}
    finally:
        fake.terminate()
        fake.wait(10)
    peer = rows["vllm bench serve"]["marginal_cpu_s_per_1k_tokens"]
    ratio = rows["vllm-spark bench"]["marginal_cpu_s_per_1k_tokens"] / peer
    result = {"streams": args.streams, "short_tokens": args.short, "long_tokens": args.long,
              "repeats": args.repeats, "fake_server": {"alpha": args.alpha, "beta": args.beta},
              "clients": rows, "ratio_marginal": ratio,
              "ratio_marginal_asyncio_loop": rows["vllm-spark (asyncio)"]["marginal_cpu_s_per_1k_tokens"] / peer,
              "ratio_total_long_run": rows["vllm-spark bench"]["total_cpu_s_per_1k_tokens_long_run"]
              / rows["vllm bench serve"]["total_cpu_s_per_1k_tokens_long_run"],
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "client_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'client':<18} {'CPU s / 1k tokens (marginal)':>30} {'CPU s / 1k tokens (whole run, long)':>36}")
    for client, r in rows.items():
        print(f"{client:<18} {r['marginal_cpu_s_per_1k_tokens']:>30.4f} {r['total_cpu_s_per_1k_tokens_long_run']:>36.4f}")
    print(f"ratio vllm-spark / vllm bench: marginal {ratio:.2f} (plain asyncio loop: "
          f"{result['ratio_marginal_asyncio_loop']:.2f}), whole run {result['ratio_total_long_run']:.2f} (target <= 1)")
    print(f"written: {RESULTS / 'client_overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
