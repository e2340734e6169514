"""The SLO guard's effect on a served load: the tiny CPU server, guard off and on, the same overload.

One run, one server at a time:

1. guard off: a closed-loop ramp (levels 1 to --ramp-max) gives the API server's fit its spread; the
   floor F is then chosen from that fit so that the live capacity at F is --target-capacity streams
   (the tiny model's capacity at 20 tok/s is in the hundreds: the ramp could not pass it on a CPU);
2. the overload, guard off, --rounds times: closed-loop at --overload times that capacity;
3. a fresh server with SPARK_PLUGIN_GUARD=admission and SPARK_PLUGIN_FLOORS=F: the same ramp (the
   engine core's own fit; the guard acts during it already), then the same overload --rounds times.

Per overload round, from the client's per-request records (streams.csv): the share of requests whose
per-stream rate meets F, rate goodput (output tokens of those per second), TTFT p50/p99, aggregate
output tokens/s; with the guard its cap, the step-time tail it priced in (its log), the aggregate
the fitted model gives at the cap, and how many requests it held.  Medians over the rounds; results
go to benchmarks/results/guard_effect.json.

Both overloads run through `vllm-spark bench --scenario overload --overload-streams N` (the same N
for both servers).

Prefill interference (`--only prefill`): `vllm-spark bench --scenario prefill-interference` on
servers with max_model_len 4096 and a 4096-token step budget: --prefill-streams decode streams,
then one prompt that fills max_model_len, --rounds times, guard off and `prefill`: the slowest
running stream's rate over the prefill window and the long prompt's TTFT.

    python benchmarks/guard_effect.py [--target-capacity 24] [--overload 3] [--requests 216] [--rounds 3]
    python benchmarks/guard_effect.py --only prefill [--prefill-floor 120] [--prefill-streams 8]
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from vllm_spark_plugin.testbed.server import VllmServer, prioritize_client
from vllm_spark_plugin.testbed.tiny_model import SERVED_NAME, ensure_tiny_model


def bench(server: VllmServer, out: Path, levels: str, requests: int, args, floor: float | None,
          prompt: int = 32, output: int | None = None, wait: bool = True):
    cmd = [sys.executable, "-m", "vllm_spark_plugin.cli", "bench", "--quiet", "--endpoint", server.base_url,
           "--model", SERVED_NAME, "--api", "completions", "--mode", "closed-loop", "--levels", levels,
           "--trials", "1", "--no-warmup", "--requests", str(requests), "--workload", "random",
           "--random-input-len", str(prompt), "--output-tokens", str(output or args.output_tokens), "--out", str(out)]
    if floor is not None:
        cmd += ["--slo-floor", f"{floor:g}", "--slo-ttft", f"{args.ttft_slo:g}"]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    with open(out / "sweep.csv", newline="") as fh:
        return [r for r in csv.DictReader(fh) if r.get("row_type") == "point"]


def metrics(server: VllmServer) -> dict[str, list[tuple[str, float]]]:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    out: dict[str, list] = {}
    for line in text.splitlines():
        if line.startswith("vllm_spark_") and " " in line:
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            out.setdefault(name, []).append((name_labels, float(value)))
    return out


def one(m, name, contains: str = "") -> float | None:
    vals = [v for labels, v in m.get(name, ()) if contains in labels]
    return vals[0] if vals else None


def prefill_scenario(args, model: str, work: Path, floor: float) -> dict:
    """`vllm-spark bench --scenario prefill-interference`: --prefill-streams decode streams running,
    then a prompt that fills max_model_len (4096 here, and a token budget as large, so that without
    the guard vLLM prefills it in one step), --rounds times, guard off and `prefill`, on fresh servers
    after the same ramp and a few long prompts (so the fit has its prefill cost, gamma): the slowest
    running stream's rate over the prefill window, the long prompt's TTFT, and the guard's budget."""
    out = {"floor": floor, "decode_streams": args.prefill_streams, "max_model_len": 4096}
    for mode in ("off", "prefill"):
        env = {"SPARK_PLUGIN_GUARD": mode, "SPARK_PLUGIN_FLOORS": f"{floor:g}", "SPARK_PLUGIN_KNEE_REFIT_SECONDS": "2"}
        server = VllmServer(model_path=model, env=env, log_path=work / f"prefill-{mode}.log", max_model_len=4096,
                            extra_args=["--max-num-batched-tokens", "4096"])
        try:
            server.start(timeout=900)
            server.prioritize_frontend()
            bench(server, work / f"pramp-{mode}", args.ramp, args.ramp_requests, args, None)
            bench(server, work / f"plong-warm-{mode}", "1,2", 4, args, None, prompt=3000, output=4)  # gamma
            rounds = []
            for k in range(args.rounds):
                r = scenario(server, work / f"pi-{mode}-{k}", "prefill-interference", args,
                             "--scenario-streams", str(args.prefill_streams), "--long-prompt-tokens", "4096",
                             "--baseline-seconds", "2", "--tail-seconds", "1", "--output-tokens", "3000")
                m = metrics(server)
                win = r.get("prefill_window") or {}
                rounds.append({"slowest_tps": win.get("slowest_tokens_per_second"),
                               "median_tps": win.get("median_tokens_per_second"),
                               "window_s": win.get("seconds"), "streams_through": win.get("streams"),
                               "baseline_tps": r.get("baseline_tokens_per_second"),
                               "long_prompt_tokens": r["long_prompt"]["prompt_tokens"],
                               "long_prompt_ttft_s": r["long_prompt"]["ttft_s"],
                               "long_completed": r["long_prompt"]["ttft_s"] is not None,
                               "prefill_budget_tokens": one(m, "vllm_spark_guard_prefill_budget_tokens")})
                print(f"prefill {mode} round {k + 1}: {json.dumps(rounds[-1])}", flush=True)
            out[mode] = {"rounds": rounds, **{key: median(r[key] for r in rounds) for key in
                                              ("slowest_tps", "median_tps", "window_s", "long_prompt_ttft_s",
                                               "baseline_tps", "prefill_budget_tokens")},
                         "long_completed": all(r["long_completed"] for r in rounds)}
        finally:
            server.stop()
    return out


def scenario(server: VllmServer, out: Path, name: str, args, *extra: str) -> dict:
    """One `vllm-spark bench --scenario NAME` run against `server`; its result from summary.json."""
    cmd = [sys.executable, "-m", "vllm_spark_plugin.cli", "bench", "--quiet", "--endpoint", server.base_url,
           "--model", SERVED_NAME, "--api", "completions", "--scenario", name, "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench --scenario {name} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text())["scenarios"][name]


def last_guard_cap(log_path: Path) -> tuple[float | None, float | None]:
    """(cap, step-time tail) from the engine core's last 'SLO guard cap' line."""
    cap = tail = None
    for line in Path(log_path).read_text(errors="replace").splitlines():
        m = re.search(r"SLO guard cap \S+ -> (\d+|none) .*step-time tail ([0-9.]+)", line)
        if m:
            cap = None if m.group(1) == "none" else float(m.group(1))
            tail = float(m.group(2))
    return cap, tail


def median(values):
    vals = sorted(v for v in values if v is not None)
    return statistics.median(vals) if vals else None


def overloads(server: VllmServer, work: Path, name: str, level: int, floor: float, args, guard: bool) -> list[dict]:
    """--rounds runs of `vllm-spark bench --scenario overload` at `level` streams (the same load for
    guard off and on), judged at `floor`."""
    rounds = []
    for k in range(args.rounds):
        r = scenario(server, work / f"overload-{name}-{k}", "overload", args, "--slo-floor", f"{floor:g}",
                     "--overload-streams", str(level), "--overload-requests", str(args.requests),
                     "--output-tokens", str(args.output_tokens), "--workload", "random", "--random-input-len", "32")
        if guard:
            m1 = metrics(server)
            r["guard_cap_logged"], r["tail"] = last_guard_cap(server.log_path)
            a, b = one(m1, "vllm_spark_step_alpha_seconds"), one(m1, "vllm_spark_step_beta_seconds")
            cap = r["guard_limit"]
            if a and b and cap:
                r["model_aggregate_at_cap_tps"] = cap / (a + b * cap)
                r["model_aggregate_at_cap_with_tail_tps"] = cap / ((a + b * cap) * (r["tail"] or 1.0))
            r["guard_errors"] = one(m1, "vllm_spark_plugin_errors_total", 'where="guard"')
        rounds.append(r)
        print(f"{name} round {k + 1}: {json.dumps({x: r[x] for x in SHOWN if x in r})}", flush=True)
    return rounds


SHOWN = ("rate_met_share", "rate_goodput_tokens_per_second", "ttft_p50_s", "ttft_p99_s", "output_tokens_per_second",
         "per_stream_median_tokens_per_second", "guard_limit", "tail", "model_aggregate_at_cap_tps",
         "model_aggregate_at_cap_with_tail_tps", "guard_requests_held", "guard_mean_wait_s", "errors")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-capacity", type=int, default=24)
    p.add_argument("--overload", type=float, default=3.0)
    p.add_argument("--ramp", default="1,2,4,8,16,32,64,128")
    p.add_argument("--ramp-requests", type=int, default=48)
    p.add_argument("--requests", type=int, default=216)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--ttft-slo", type=float, default=2.0)
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "guard_effect.json"))
    p.add_argument("--only", choices=("admission", "prefill"), help="one scenario (the other kept from --json)")
    p.add_argument("--prefill-floor", type=float, default=120.0)
    p.add_argument("--prefill-streams", type=int, default=8)
    args = p.parse_args(argv)
    model = str(ensure_tiny_model())
    work = Path(tempfile.mkdtemp(prefix="guard-"))
    result: dict = {"args": vars(args), "runs": {}}
    out_json = Path(args.json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    prioritize_client()
    refit = {"SPARK_PLUGIN_KNEE_REFIT_SECONDS": "2"}
    if args.only == "prefill":
        kept = json.loads(out_json.read_text()) if out_json.exists() else {}
        kept["prefill"] = prefill_scenario(args, model, work, args.prefill_floor)
        out_json.write_text(json.dumps(kept, indent=2) + "\n")
        for mode in ("off", "prefill"):
            r = kept["prefill"][mode]
            print(f"{mode:>8} (median of {args.rounds}): slowest stream over the prefill {r['slowest_tps']} tok/s "
                  f"(median {r['median_tps']}, baseline {r['baseline_tps']}), window {r['window_s']} s, long prompt "
                  f"TTFT {r['long_prompt_ttft_s']} s, completed {r['long_completed']}, budget {r['prefill_budget_tokens']}")
        return 0

    kept = json.loads(out_json.read_text()) if out_json.exists() else {}
    if "prefill" in kept:  # the other scenario's last figures stay
        result["prefill"] = kept["prefill"]
    server = VllmServer(model_path=model, env={"SPARK_PLUGIN_GUARD": "off", **refit}, log_path=work / "off.log")
    try:
        server.start(timeout=900)
        server.prioritize_frontend()
        bench(server, work / "ramp-off", args.ramp, args.ramp_requests, args, None)
        time.sleep(5)
        m = metrics(server)
        alpha, beta = one(m, "vllm_spark_step_alpha_seconds"), one(m, "vllm_spark_step_beta_seconds")
        if not alpha or not beta:
            raise RuntimeError(f"the ramp gave no fit: alpha={alpha} beta={beta}")
        from vllm_spark_plugin.definitions import STREAM_RATE_BUCKETS  # a floor must be a bucket bound
        want = 1.0 / (alpha + beta * (args.target_capacity + 0.5))
        floor = min(STREAM_RATE_BUCKETS, key=lambda b: abs(b - want))
        level = int(round(args.overload * args.target_capacity))
        result.update(fit_off={"alpha_s": alpha, "beta_s": beta, "knee": one(m, "vllm_spark_knee_batch_size"),
                               "live_capacity_at_floor": one(m, "vllm_spark_capacity_streams", f'floor="{floor:g}"')},
                      floor=floor, overload_concurrency=level, rounds={})
        print(f"fit alpha={alpha:.5f} s beta={beta:.6f} s: floor {floor} tok/s gives capacity "
              f"{args.target_capacity}; overload at {level} streams", flush=True)
        result["rounds"]["off"] = overloads(server, work, "off", level, floor, args, guard=False)
        out_json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        server.stop()

    env = {"SPARK_PLUGIN_GUARD": "admission", "SPARK_PLUGIN_FLOORS": f"{floor:g}", **refit}
    server = VllmServer(model_path=model, env=env, log_path=work / "on.log")
    try:
        server.start(timeout=900)
        server.prioritize_frontend()
        bench(server, work / "ramp-on", args.ramp, args.ramp_requests, args, None)
        result["guard_cap_before"] = one(metrics(server), "vllm_spark_guard_admission_limit")
        result["rounds"]["admission"] = overloads(server, work, "admission", level, floor, args, guard=True)
        m1 = metrics(server)
        result["fit_on"] = {"alpha_s": one(m1, "vllm_spark_step_alpha_seconds"),
                            "beta_s": one(m1, "vllm_spark_step_beta_seconds"),
                            "knee": one(m1, "vllm_spark_knee_batch_size")}
    finally:
        server.stop()
    result["runs"] = {name: {key: median(r.get(key) for r in rounds) for key in rounds[0]
                             if all(isinstance(r.get(key), (int, float, type(None))) for r in rounds)}
                      for name, rounds in result["rounds"].items()}
    off, on = result["runs"]["off"], result["runs"]["admission"]
    # guard off at three times the capacity, often no request meets the floor: the ratio is unbounded
    result["goodput_ratio"] = (on["rate_goodput_tokens_per_second"] / off["rate_goodput_tokens_per_second"]
                               if off.get("rate_goodput_tokens_per_second") else None)
    out_json.write_text(json.dumps(result, indent=2) + "\n")
    for name, r in result["runs"].items():
        print(f"{name:>9} (median of {args.rounds}): " + json.dumps({x: r.get(x) for x in SHOWN if x in r}))
    print("rate goodput with/without the guard: " + (f"{result['goodput_ratio']:.2f}x" if result["goodput_ratio"]
          else f"{on['rate_goodput_tokens_per_second']:.0f} tok/s against 0 without it"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
