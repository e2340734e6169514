"""The SLO guard's effect on a served load: the tiny CPU server, guard off and on, the same overload.

One run, one server at a time:

1. guard off: a closed-loop ramp (levels 1 to --ramp-max) gives the API server's fit its spread; the
   floor F is then chosen from that fit so that the capacity at F is --target-capacity streams
   (the tiny model's capacity at 20 tok/s is in the hundreds: the ramp could not pass it on a CPU);
2. the overload, guard off: closed-loop at --overload times that capacity, judged at floor F;
3. a fresh server with SPARK_PLUGIN_GUARD=admission and SPARK_PLUGIN_FLOORS=F: the same ramp (the
   engine core's own fit; the guard acts during it already), then the same overload.

Per overload run: the share of requests meeting the floor (and TTFT <= --ttft-slo), goodput (output
tokens/s of those), TTFT p50/p99, aggregate output tokens/s, the guard's cap and how many requests it
held.  Results go to benchmarks/results/guard_effect.json.

Prefill interference (`--only prefill`): 8 decode streams of 256 tokens while 1500-token prompts
arrive two at a time, guard off and `prefill`, on fresh servers after the same ramp: the decode
streams' per-stream rate and the long prompts' TTFT.

    python benchmarks/guard_effect.py [--target-capacity 24] [--overload 3] [--requests 144]
    python benchmarks/guard_effect.py --only prefill [--prefill-floor 150]
"""
from __future__ import annotations

import argparse
import csv
import json
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


def row_summary(row: dict) -> dict:
    def f(k):
        return float(row[k]) if row.get(k) not in (None, "") else None
    return {"concurrency": int(row["concurrency"]), "completed": int(row["completed"]), "errors": int(row["errors"]),
            "slo_attainment": f("slo_attainment"), "goodput_tps": f("goodput_tps"), "ttft_p50_s": f("ttft_p50_s"),
            "ttft_p99_s": f("ttft_p99_s"), "output_tps": f("output_tps"),
            "per_stream_median_tps": f("per_stream_median_tps"), "per_stream_p10_tps": f("per_stream_p10_tps"),
            "slo_missed_rate": f("slo_missed_rate"), "slo_missed_ttft": f("slo_missed_ttft")}


def read_rows(out: Path) -> list[dict]:
    with open(out / "sweep.csv", newline="") as fh:
        return [r for r in csv.DictReader(fh) if r.get("row_type") == "point"]


def prefill_scenario(args, model: str, work: Path, floor: float) -> dict:
    """Decode streams (8, 256 tokens each) while long prompts (1500 tokens, 2 at a time) arrive, guard
    off and `prefill`: the decode streams' per-stream rate and the long prompts' TTFT."""
    out = {"floor": floor, "decode_streams": 8, "long_prompt_tokens": 1500}
    for mode in ("off", "prefill"):
        env = {"SPARK_PLUGIN_GUARD": mode, "SPARK_PLUGIN_FLOORS": f"{floor:g}", "SPARK_PLUGIN_KNEE_REFIT_SECONDS": "2"}
        server = VllmServer(model_path=model, env=env, log_path=work / f"prefill-{mode}.log")
        try:
            server.start(timeout=900)
            server.prioritize_frontend()
            bench(server, work / f"pramp-{mode}", args.ramp, args.ramp_requests, args, None)
            bench(server, work / f"plong-warm-{mode}", "2", 4, args, None, prompt=1500, output=4)  # gamma
            decode = bench(server, work / f"pdecode-{mode}", "8", 16, args, floor, prompt=32, output=256, wait=False)
            time.sleep(2)
            long = bench(server, work / f"plong-{mode}", "2", 6, args, None, prompt=1500, output=4, wait=False)
            for proc in (decode, long):
                if proc.wait() != 0:
                    raise RuntimeError(f"bench failed: {proc.stderr.read()[-2000:]}")
            m = metrics(server)
            (d,) = read_rows(work / f"pdecode-{mode}")
            (lp,) = read_rows(work / f"plong-{mode}")
            out[mode] = {"decode": row_summary(d), "long_prompt_ttft_p50_s": row_summary(lp)["ttft_p50_s"],
                         "long_prompt_ttft_p99_s": row_summary(lp)["ttft_p99_s"], "long_completed": int(lp["completed"]),
                         "prefill_budget_tokens": one(m, "vllm_spark_guard_prefill_budget_tokens")}
        finally:
            server.stop()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-capacity", type=int, default=24)
    p.add_argument("--overload", type=float, default=3.0)
    p.add_argument("--ramp", default="1,2,4,8,16,32,64,128")
    p.add_argument("--ramp-requests", type=int, default=48)
    p.add_argument("--requests", type=int, default=144)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--ttft-slo", type=float, default=2.0)
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "guard_effect.json"))
    p.add_argument("--only", choices=("admission", "prefill"), help="one scenario (the other kept from --json)")
    p.add_argument("--prefill-floor", type=float, default=150.0)
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
            print(f"{mode:>8}: decode per-stream p50 {r['decode']['per_stream_median_tps']} p10 "
                  f"{r['decode']['per_stream_p10_tps']} tok/s, attainment {r['decode']['slo_attainment']}; long prompts "
                  f"TTFT p50 {r['long_prompt_ttft_p50_s']} s p99 {r['long_prompt_ttft_p99_s']} s "
                  f"({r['long_completed']} completed), budget {r['prefill_budget_tokens']}")
        return 0

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
        result.update(fit_off={"alpha_s": alpha, "beta_s": beta, "knee": one(m, "vllm_spark_knee_batch_size")},
                      floor=floor, overload_concurrency=level)
        print(f"fit alpha={alpha:.5f} s beta={beta:.6f} s: floor {floor} tok/s gives capacity "
              f"{args.target_capacity}; overload at {level} streams", flush=True)
        (row,) = bench(server, work / "overload-off", str(level), args.requests, args, floor)
        result["runs"]["off"] = row_summary(row)
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
        m0 = metrics(server)
        (row,) = bench(server, work / "overload-on", str(level), args.requests, args, floor)
        m1 = metrics(server)
        on = row_summary(row)
        on["guard_cap"] = one(m1, "vllm_spark_guard_admission_limit")
        held0 = one(m0, "vllm_spark_guard_deferred_seconds_count") or 0.0
        held1 = one(m1, "vllm_spark_guard_deferred_seconds_count") or 0.0
        on["requests_held"] = held1 - held0
        s0 = one(m0, "vllm_spark_guard_deferred_seconds_sum") or 0.0
        s1 = one(m1, "vllm_spark_guard_deferred_seconds_sum") or 0.0
        on["mean_held_s"] = (s1 - s0) / (held1 - held0) if held1 > held0 else None
        on["guard_errors"] = one(m1, "vllm_spark_plugin_errors_total", 'where="guard"')
        result["runs"]["admission"] = on
        result["fit_on"] = {"alpha_s": one(m1, "vllm_spark_step_alpha_seconds"),
                            "beta_s": one(m1, "vllm_spark_step_beta_seconds"),
                            "knee": one(m1, "vllm_spark_knee_batch_size")}
    finally:
        server.stop()
    out_json.write_text(json.dumps(result, indent=2) + "\n")
    for name, r in result["runs"].items():
        print(f"{name:>9}: attainment {r['slo_attainment']}, goodput {r['goodput_tps']} tok/s, TTFT p50 "
              f"{r['ttft_p50_s']} s p99 {r['ttft_p99_s']} s, aggregate {r['output_tps']} tok/s, per-stream p50 "
              f"{r['per_stream_median_tps']}" + (f", cap {r.get('guard_cap')}, held {r.get('requests_held')}"
                                                  if name != "off" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
