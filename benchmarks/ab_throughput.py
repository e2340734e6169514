"""End-to-end cost of the plugin: output tokens/s of the tiny CPU server at concurrency 16, with and
without the plugin, alternated A/B, medians of several rounds, plus the server's CPU time per token.

Both servers run side by side on loopback (an idle CPU vLLM server uses next to no CPU); each round
runs the same closed-loop load (`vllm-spark bench --mode closed-loop` in its own process, 16 in
flight, random 32-token prompts, 256 output tokens) against one, then the other, the order flipping
every round (ABBA), so drift of the machine hits both alike.

Figures per round: output tok/s (output tokens / wall time of the run, `vllm bench serve`'s
definition) and the CPU seconds each server process (API server, engine core, worker) spent per 1,000
output tokens.  The throughput ratio is reported as the ratio of the medians, the median of the
per-round ratios (each round's pair ran back to back), and the geometric mean of those with a 95%
interval.  CPU time per token says in which process a cost sits; it is noisy too (the engine core
waits for its worker by busy-polling, which takes whatever CPU is left), so `py-spy` on the API
server is the finer tool for the plugin's own share.

    python benchmarks/ab_throughput.py [--rounds 20] [--concurrency 16] [--requests 128]

Results go to benchmarks/results/ab_throughput.json as each round completes.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from vllm_spark_plugin.testbed.server import VllmServer, prioritize_client
from vllm_spark_plugin.testbed.tiny_model import SERVED_NAME, ensure_tiny_model

ROLES = ("api_server", "engine_core", "worker")
# two-sided 95% Student t quantiles by degrees of freedom (1.96 beyond 29)
_T95 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 24: 2.064, 29: 2.045}


def _role(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == root_pid:
        return "api_server"
    name = proc.name()
    if "Worker" in name:
        return "worker"
    if "EngineCore" in name:
        return "engine_core"
    return "other"


def server_cpu(server: VllmServer) -> dict[str, float]:
    """CPU seconds (user + system, threads included) used so far by each process of the server."""
    root = psutil.Process(server.proc.pid)
    out = dict.fromkeys(ROLES + ("other",), 0.0)
    for p in [root] + root.children(recursive=True):
        try:
            t = p.cpu_times()
            out[_role(p, root.pid)] += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def run_load(server: VllmServer, out: Path, args) -> dict:
    """One closed-loop run in its own process; output tok/s and the server's CPU s per 1k tokens."""
    cmd = [sys.executable, "-m", "vllm_spark_plugin.cli", "bench", "--quiet", "--endpoint", server.base_url,
           "--model", SERVED_NAME, "--api", "completions", "--mode", "closed-loop",
           "--levels", str(args.concurrency), "--trials", "1", "--no-warmup", "--requests", str(args.requests),
           "--workload", "random", "--random-input-len", "32", "--output-tokens", str(args.output_tokens),
           "--out", str(out)]
    before = server_cpu(server)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    after = server_cpu(server)
    if proc.returncode != 0:
        raise RuntimeError(f"bench failed against {server.base_url} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    with open(out / "sweep.csv", newline="") as fh:
        (row,) = [r for r in csv.DictReader(fh) if r.get("row_type") == "point"]
    tokens = int(row["output_tokens"])
    if int(row["errors"]) or not row["output_tps"] or tokens <= 0:
        raise RuntimeError(f"run against {server.base_url} had errors or no output: {row}")
    cpu = {r: round(1000 * (after[r] - before[r]) / tokens, 5) for r in ROLES}
    cpu["total"] = round(sum(1000 * (after[r] - before[r]) / tokens for r in after), 5)
    return {"output_tps": float(row["output_tps"]), "cpu_s_per_1k_tokens": cpu}


def summarize(results: dict, args) -> dict:
    a = [r["output_tps"] for r in results["with_plugin"]]
    b = [r["output_tps"] for r in results["without_plugin"]]
    n = min(len(a), len(b))
    summary = {"concurrency": args.concurrency, "requests": args.requests, "output_tokens": args.output_tokens,
               "rounds_done": n, "with_plugin": results["with_plugin"], "without_plugin": results["without_plugin"]}
    if n:
        summary.update(
            median_with_tps=round(statistics.median(a), 1), median_without_tps=round(statistics.median(b), 1),
            ratio_of_medians=round(statistics.median(a) / statistics.median(b), 4),
            median_paired_ratio=round(statistics.median(x / y for x, y in zip(a, b)), 4))
        if n >= 3:  # geometric mean of the paired ratios with a 95% interval (t on the log ratios)
            logs = [math.log(x / y) for x, y in zip(a, b)]
            t = 1.96 if n - 1 > 29 else _T95[max(k for k in _T95 if k <= n - 1)]  # conservative between rows
            half = t * statistics.stdev(logs) / math.sqrt(n)
            mean = statistics.fmean(logs)
            summary["paired_ratio_geomean_ci95"] = [round(math.exp(mean), 4), round(math.exp(mean - half), 4),
                                                    round(math.exp(mean + half), 4)]
        for key in ROLES + ("total",):
            ca = statistics.median(r["cpu_s_per_1k_tokens"][key] for r in results["with_plugin"])
            cb = statistics.median(r["cpu_s_per_1k_tokens"][key] for r in results["without_plugin"])
            summary.setdefault("median_cpu_s_per_1k_tokens", {})[key] = {
                "with": round(ca, 5), "without": round(cb, 5), "ratio": round(ca / cb, 4) if cb else None}
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "ab_throughput.json"))
    args = p.parse_args(argv)

    model = str(ensure_tiny_model())
    work = Path(tempfile.mkdtemp(prefix="ab-"))
    servers = {"with_plugin": VllmServer(model_path=model, plugin=True, log_path=work / "with.log"),
               "without_plugin": VllmServer(model_path=model, plugin=False, log_path=work / "without.log")}
    results: dict[str, list] = {name: [] for name in servers}
    out_json = Path(args.json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    try:
        for s in servers.values():
            s.start(timeout=900)
            s.prioritize_frontend()  # token timings as they happen on 2 cores (see VllmServer)
        prioritize_client()  # the load processes inherit it
        for name, s in servers.items():  # one unmeasured warm-up each
            run_load(s, work / f"warm-{name}", args)
        for i in range(args.rounds):
            order = list(servers.items())
            if i % 2:
                order.reverse()
            for name, server in order:
                if not server.alive():
                    raise RuntimeError(f"the {name} server died; log: {server.log_path}")
                r = run_load(server, work / f"{name}-{i}", args)
                results[name].append(r)
                print(f"round {i + 1}/{args.rounds} {name:>15}: {r['output_tps']:8.1f} tok/s, "
                      f"server CPU {r['cpu_s_per_1k_tokens']['total']:.3f} s per 1k tokens", flush=True)
            out_json.write_text(json.dumps(summarize(results, args), indent=2) + "\n")  # kept if we die later
    finally:
        for s in servers.values():
            s.stop()
    summary = summarize(results, args)
    out_json.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"output tok/s, median of {summary['rounds_done']} rounds: with the plugin {summary['median_with_tps']}, "
          f"without {summary['median_without_tps']}; ratio of medians {summary['ratio_of_medians']}, "
          f"median paired ratio {summary['median_paired_ratio']} (target >= 0.97)")
    if "paired_ratio_geomean_ci95" in summary:
        g, lo, hi = summary["paired_ratio_geomean_ci95"]
        print(f"geometric mean of the paired ratios {g} (95% interval {lo}-{hi})")
    for key, v in summary["median_cpu_s_per_1k_tokens"].items():
        print(f"  server CPU s per 1k tokens, {key:>11}: with {v['with']:.4f}, without {v['without']:.4f}, ratio {v['ratio']}")
    return 0 if summary["ratio_of_medians"] >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
