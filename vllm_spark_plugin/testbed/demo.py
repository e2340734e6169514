"""`vllm-spark demo`: the whole product on the embedded default, end to end.

1. build the tiny local model (offline, deterministic);
2. serve it with vLLM and the plugin (live knee refitted every 2 s, capacity at the demo's floor);
3. find the knee and the capacity with the adaptive sweep (`vllm-spark bench --levels auto`): it
   grows the concurrency until the knee has an interval and a level misses the floor, then bisects
   the capacity to one stream;
4. write the report (CSV, JSON, PNG, HTML, capacity profile) and print the offline knee;
5. wait for the live refit, then print the knee, plateau, capacity and verdict the plugin exports on
   vLLM's own /metrics beside the offline ones, with their ratio.

The floor is 60 tok/s, not the seed's 20: on two CPU cores the tiny model still streams about 50-75
tok/s per stream at 32-64 streams, so 20 tok/s lies past 100 streams, beyond a short demo's sweep.  A
floor is any positive tok/s (`definitions.check_floor`, the rule the server's settings use).  Three trials per level: on a shared 2-core box single waves are often disturbed, and
the median of three is not.
"""
from __future__ import annotations

import json
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from vllm_spark_plugin.metrics import names as N
from vllm_spark_plugin.testbed.server import ServerStartError, VllmServer, prioritize_client
from vllm_spark_plugin.testbed.tiny_model import SERVED_NAME, ensure_tiny_model

DEMO_FLOOR = 60.0
LIVE_REFIT_SECONDS = 2.0
SHOW = ("vllm_spark_step_batch_size", "vllm_spark_step_duration_seconds", "vllm_spark_ttft_seconds",
        "vllm_spark_stream_decode_tokens_per_second", "vllm_spark_generation_tokens", "vllm_spark_kv_blocks_total",
        "vllm_spark_unified_memory_bytes", "vllm_spark_plugin_errors", "vllm_spark_info")


def add_arguments(parser) -> None:
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--levels", default="auto",
                        help="sweep concurrency levels, or auto: the adaptive search (default: %(default)s)")
    parser.add_argument("--floor", type=_floor, default=DEMO_FLOOR,
                        help="per-stream rate floor for capacity, tok/s (default: %(default)s)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--budget-seconds", type=float, default=180.0,
                        help="time budget of the adaptive sweep (default: %(default)s)")
    parser.add_argument("--live-timeout", type=float, default=60.0,
                        help="seconds to wait for the live refit after the sweep (default: %(default)s)")
    parser.add_argument("--keep-serving", action="store_true", help="keep the server up after the demo (Ctrl-C stops)")


def _floor(text: str) -> float:
    import argparse

    from vllm_spark_plugin.definitions import SLOError, check_floor
    try:
        return check_floor(text)
    except (SLOError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


# ------------------------------------------------------------------------------- reading /metrics
def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


@dataclass
class LiveKnee:
    """The live fit as /metrics shows it (None where a series is missing)."""

    samples: float | None = None
    verdict: str | None = None
    knee: float | None = None
    plateau: float | None = None
    capacity: float | None = None
    r2: float | None = None
    profile_knee: float | None = None
    profile_capacity: float | None = None

    @property
    def ready(self) -> bool:
        return bool(self.samples) and self.verdict == "ok" and self.knee is not None


def live_knee(text: str, floor: float) -> LiveKnee:
    floor_label = f"{floor:g}"
    out = LiveKnee()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == N.KNEE_FIT_SAMPLES:
                out.samples = s.value
            elif s.name == N.KNEE_VERDICT and s.value == 1:
                out.verdict = s.labels.get("verdict")
            elif s.name == N.KNEE_BATCH:
                out.knee = s.value
            elif s.name == N.MAX_THROUGHPUT:
                out.plateau = s.value
            elif s.name == N.CAPACITY_STREAMS and s.labels.get("floor") == floor_label:
                out.capacity = s.value
            elif s.name == N.KNEE_FIT_R2:
                out.r2 = s.value
            elif s.name == N.PROFILE_KNEE_BATCH:
                out.profile_knee = s.value
            elif s.name == N.PROFILE_CAPACITY_STREAMS and s.labels.get("floor") == floor_label:
                out.profile_capacity = s.value
    return out


def wait_for_live_knee(url: str, floor: float, timeout: float, poll: float = 1.0) -> tuple[LiveKnee, float, str]:
    """Poll /metrics until the live fit has samples and the verdict ok (or the timeout): the last
    reading, the seconds waited, and why it stopped."""
    t0 = time.monotonic()
    live = LiveKnee()
    while True:
        try:
            live = live_knee(scrape(url), floor)
        except OSError as exc:
            return live, time.monotonic() - t0, f"/metrics could not be read ({exc})"
        waited = time.monotonic() - t0
        if live.ready:
            return live, waited, "refit done"
        if waited >= timeout:
            why = ("no step samples reached the live fit" if not live.samples else
                   f"the live fit's verdict is {live.verdict!r}, not 'ok'")
            return live, waited, f"gave up after {timeout:.0f} s: {why}"
        time.sleep(poll)


def live_metrics(text: str) -> list[str]:
    """One line per other series worth showing (histograms as count and mean)."""
    lines = []
    for fam in text_string_to_metric_families(text):
        if fam.name not in SHOW:
            continue
        if fam.type == "histogram":
            counts = {tuple(sorted(s.labels.items())): s.value for s in fam.samples if s.name.endswith("_count")}
            sums = {tuple(sorted(s.labels.items())): s.value for s in fam.samples if s.name.endswith("_sum")}
            for key, c in counts.items():
                mean = sums.get(key, 0.0) / c if c else 0.0
                lines.append(f"  {fam.name}{_labels(key)}  count={c:.0f} mean={mean:.4g}")
        else:
            for s in fam.samples:
                if not s.name.endswith("_created"):
                    lines.append(f"  {s.name}{_labels(tuple(sorted(s.labels.items())))}  {s.value:.6g}")
    return lines


def _labels(items) -> str:
    keep = [(k, v) for k, v in items if k not in ("model_name",)]
    return "{" + ",".join(f'{k}="{v}"' for k, v in keep) + "}" if keep else ""


# ------------------------------------------------------------------------------- the knee block
def offline_knee(summary: dict, floor: float) -> dict:
    """The sweep's knee, interval, plateau, capacity at the floor and how it was found."""
    curve = summary["curves"][0]
    k = curve.get("knee") or {}
    search = curve.get("search") or {}
    bound = next((b for b in search.get("boundaries") or [] if b["kind"] == "floor"
                  and abs(b["threshold"] - floor) < 1e-9), None)
    return {"knee": k.get("knee"), "knee_ci": (k.get("ci") or {}).get("knee"), "verdict": k.get("verdict"),
            "plateau": k.get("plateau_tokens_per_second"), "capacity": curve["capacity"].get(f"{floor:g}"),
            "boundary": bound, "points": len(curve["points"]), "search": search}


def _f(x, spec=".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def knee_block(offline: dict, live: LiveKnee, floor: float) -> list[str]:
    """The offline and live estimates side by side, with live/offline."""
    rows = [("knee K (streams)", offline["knee"], live.knee, ".1f"),
            ("plateau (tok/s)", offline["plateau"], live.plateau, ".0f"),
            (f"capacity at {floor:g} tok/s (streams)", offline["capacity"], live.capacity, ".0f")]
    lines = [f"  {'':34} {'offline (sweep)':>16} {'live (/metrics)':>16} {'live/offline':>13}"]
    for name, off, on, spec in rows:
        ratio = on / off if off and on is not None else None
        lines.append(f"  {name:34} {_f(off, spec):>16} {_f(on, spec):>16} {_f(ratio, '.2f'):>13}")
    lines.append(f"  {'verdict':34} {str(offline['verdict']):>16} {str(live.verdict):>16}")
    return lines


def offline_lines(offline: dict, floor: float) -> list[str]:
    ci = offline["knee_ci"]
    ci_txt = f" [{ci[0]:.1f}, {ci[1]:.1f}] (95% bootstrap interval)" if ci and None not in ci else " (no interval)"
    lines = [f"  knee K = {_f(offline['knee'])} streams{ci_txt}, plateau {_f(offline['plateau'], '.0f')} tok/s, "
             f"verdict {offline['verdict']}"]
    b = offline["boundary"]
    cap = offline["capacity"]
    if b is not None and b["status"] == "known to one stream" and cap:
        lines.append(f"  capacity at {floor:g} tok/s: {cap} streams ({cap} meets the floor, {cap + 1} misses it; "
                     f"{offline['points']} levels measured, {b['bisection_probes']} of them bisecting)")
    else:
        lines.append(f"  capacity at {floor:g} tok/s: {cap if cap is not None else 'none measured'}"
                     + (f" ({b['status']})" if b else ""))
    return lines


def run(args) -> int:
    from vllm_spark_plugin import cli

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    print("[1/5] building the tiny local model ...", flush=True)
    model = ensure_tiny_model()
    sweep_dir = out / "sweep"
    profile = sweep_dir / "capacity_profile.json"
    # The plugin watches the profile (once the sweep writes it, the offline knee shows beside the live
    # one), refits the live knee every 2 s (the default 10 s would come after the demo reads it), and
    # reports capacity at the demo's floor.
    env = {"SPARK_PLUGIN_PROFILE": str(profile.resolve()),
           "SPARK_PLUGIN_KNEE_REFIT_SECONDS": f"{LIVE_REFIT_SECONDS:g}",
           "SPARK_PLUGIN_FLOORS": f"{args.floor:g}"}
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
        how = ("adaptive search: grow until the knee and the floor are bracketed, then bisect"
               if args.levels == "auto" else f"levels {args.levels}")
        print(f"[3/5] sweeping concurrency ({how}; waves, warm-up, medians) ...", flush=True)
        bench = ["bench", "--endpoint", server.base_url, "--model", SERVED_NAME, "--api", "completions",
                 "--levels", args.levels, "--trials", str(args.trials), "--workload", "prose",
                 "--output-tokens", str(args.output_tokens), "--floor", f"{args.floor:g}", "--out", str(sweep_dir)]
        if args.levels == "auto":
            bench += ["--budget-seconds", f"{args.budget_seconds:g}"]
        rc = cli.main(bench)
        if rc != 0:
            print(f"vllm-spark demo: the sweep failed (exit {rc})", file=sys.stderr)
            return rc
        summary = json.loads((sweep_dir / "summary.json").read_text())
        offline = offline_knee(summary, args.floor)
        print(f"[4/5] report: {sweep_dir / 'report.html'}  (CSV, JSON, PNG and capacity profile beside it)")
        print("      offline knee (fitted to the sweep):")
        for line in offline_lines(offline, args.floor):
            print(line)
        print(f"[5/5] live knee on vLLM's /metrics ({server.metrics_url}), refitted every "
              f"{LIVE_REFIT_SECONDS:g} s: waiting for a refit with the sweep's steps ...", flush=True)
        live, waited, why = wait_for_live_knee(server.metrics_url, args.floor, args.live_timeout)
        print(f"      {why} after {waited:.0f} s; live fit on {_f(live.samples, '.0f')} steps, "
              f"R² {_f(live.r2, '.3f')}")
        for line in knee_block(offline, live, args.floor):
            print(line)
        print("      other live series:")
        for line in live_metrics(scrape(server.metrics_url)):
            print(line)
        print(f"demo finished in {time.monotonic() - t_start:.0f} s")
        if args.keep_serving:
            print(f"serving on {server.base_url}; Ctrl-C stops", flush=True)
            while server.alive():
                time.sleep(1.0)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        server.stop()
