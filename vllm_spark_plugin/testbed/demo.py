"""`vllm-spark demo`: the whole product on the embedded default, end to end.

1. build the tiny local model (offline, deterministic);
2. serve it with vLLM and the plugin;
3. run a short concurrency sweep with the seed protocol (`vllm-spark bench`);
4. write the report (CSV, JSON, PNG, HTML, capacity profile) and print the capacity statement;
5. show the live per-step metrics the plugin exports on vLLM's own /metrics, knee included.
"""
from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from vllm_spark_plugin.testbed.server import ServerStartError, VllmServer, prioritize_client
from vllm_spark_plugin.testbed.tiny_model import SERVED_NAME, ensure_tiny_model

SHOW = ("vllm_spark_step_batch_size", "vllm_spark_step_duration_seconds", "vllm_spark_ttft_seconds",
        "vllm_spark_stream_decode_tokens_per_second", "vllm_spark_generation_tokens", "vllm_spark_kv_blocks_total",
        "vllm_spark_knee_batch_size", "vllm_spark_max_throughput_tokens_per_second", "vllm_spark_capacity_streams",
        "vllm_spark_knee_fit_r2", "vllm_spark_knee_fit_samples", "vllm_spark_profile_knee_batch_size",
        "vllm_spark_unified_memory_bytes", "vllm_spark_plugin_errors", "vllm_spark_info")


def add_arguments(parser) -> None:
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--levels", default="1,2,4,8,16", help="sweep concurrency levels (default: %(default)s)")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--keep-serving", action="store_true", help="keep the server up after the demo (Ctrl-C stops)")


def live_metrics(url: str) -> list[str]:
    """One line per series worth showing (histograms as count and mean)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    lines = []
    for fam in text_string_to_metric_families(text):
        if fam.name not in SHOW:
            continue
        if fam.type == "histogram":
            counts = {tuple(sorted((k, v) for k, v in s.labels.items())): s.value for s in fam.samples if s.name.endswith("_count")}
            sums = {tuple(sorted((k, v) for k, v in s.labels.items())): s.value for s in fam.samples if s.name.endswith("_sum")}
            for key, c in counts.items():
                mean = sums.get(key, 0.0) / c if c else 0.0
                lines.append(f"  {fam.name}{_labels(key)}  count={c:.0f} mean={mean:.4g}")
        else:
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                lines.append(f"  {s.name}{_labels(tuple(sorted(s.labels.items())))}  {s.value:.6g}")
    return lines


def _labels(items) -> str:
    keep = [(k, v) for k, v in items if k not in ("model_name",)]
    return "{" + ",".join(f'{k}="{v}"' for k, v in keep) + "}" if keep else ""


def run(args) -> int:
    from vllm_spark_plugin import cli

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    print("[1/5] building the tiny local model ...", flush=True)
    model = ensure_tiny_model()
    profile = out / "sweep" / "capacity_profile.json"
    # The plugin watches this file: once the sweep writes it, the offline knee shows beside the live one.
    env = {"SPARK_PLUGIN_PROFILE": str(profile.resolve())}
    server = VllmServer(model_path=str(model), served_name=SERVED_NAME, port=args.port,
                        log_path=out / "server.log", env=env)
    print(f"[2/5] starting vLLM with the plugin on {server.base_url} (log: {server.log_path}) ...", flush=True)
    t0 = time.monotonic()
    try:
        server.start(timeout=900)
    except ServerStartError as exc:
        print(f"vllm-spark demo: {exc}", file=sys.stderr)
        return 1
    print(f"      ready in {time.monotonic() - t0:.0f}s", flush=True)
    # On a small CPU box the engine's compute threads starve the API server and this client, and
    # tokens then arrive in bursts; give both priority when allowed (root).  A Spark needs none of it.
    server.prioritize_frontend()
    prioritize_client()
    try:
        print(f"[3/5] sweeping concurrency {args.levels} (seed protocol: waves, warm-up, medians) ...", flush=True)
        rc = cli.main(["bench", "--endpoint", server.base_url, "--model", SERVED_NAME, "--api", "completions",
                       "--levels", args.levels, "--trials", str(args.trials), "--workload", "prose",
                       "--output-tokens", str(args.output_tokens), "--out", str(out / "sweep")])
        if rc != 0:
            print(f"vllm-spark demo: the sweep failed (exit {rc})", file=sys.stderr)
            return rc
        print(f"[4/5] report: {out / 'sweep' / 'report.html'}  (CSV, JSON, PNG and capacity profile beside it)")
        print("[5/5] live metrics on vLLM's /metrics (" + server.metrics_url + "):")
        for line in live_metrics(server.metrics_url):
            print(line)
        if args.keep_serving:
            print(f"serving on {server.base_url}; Ctrl-C stops", flush=True)
            while server.alive():
                time.sleep(1.0)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        server.stop()
