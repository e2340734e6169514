"""What the plugin's series cost the API server off the per-step path: the /metrics render and the
OpenTelemetry bridge, side by side in one run, on a registry that holds vLLM's own Prometheus
logger and the plugin's after the same steps (`record_overhead.make_stats`, 64 streams).

    render, whole registry     prometheus-client's `generate_latest` of the process's registry (/metrics)
    render, plugin series      the same for the plugin's instruments alone (its share of a scrape)
    bridge, before             what the bridge did until now: collect the whole registry, keep the
                               vllm_spark_* families, convert them
    bridge, after (changed)    collect only the plugin's instruments, convert them
    bridge, after (unchanged)  collect only the plugin's instruments, find nothing changed, stop

Medians of `--runs` rounds of `--repeat` calls each; milliseconds per call.

    python benchmarks/render_overhead.py [--runs 7] [--repeat 20]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def per_call_ms(fn, repeat: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat * 1000.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "render_overhead.json"))
    args = p.parse_args(argv)

    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

    from record_overhead import loggers, make_stats
    from vllm_spark_plugin.metrics import otel_bridge
    from vllm_spark_plugin.metrics.step import HookStep

    theirs, ours = loggers()
    for s, it, hook in make_stats(args.streams, 2000, 256):
        theirs.record(s, it, None, 0)
        ours.record(s, it, None, 0)
        ours.record_step(HookStep(*hook))
    ours.exporter.refresh_knee()

    collectors = ours.exporter.ins.collectors()
    plugin_only = CollectorRegistry()
    for c in collectors:
        plugin_only.register(c)

    def bridge_before():
        families = [f for f in REGISTRY.collect() if f.name.startswith(otel_bridge.PREFIX)]
        return otel_bridge.collect_metrics_data(families)

    def bridge_changed():
        return otel_bridge.collect_metrics_data(otel_bridge.collect(collectors))

    last = otel_bridge.fingerprint(otel_bridge.collect(collectors))

    def bridge_unchanged():
        assert otel_bridge.fingerprint(otel_bridge.collect(collectors)) == last

    cases = {"render, whole registry": lambda: generate_latest(REGISTRY),
             "render, plugin series": lambda: generate_latest(plugin_only),
             "bridge, before": bridge_before,
             "bridge, after (changed)": bridge_changed,
             "bridge, after (unchanged)": bridge_unchanged}
    times = {k: [] for k in cases}
    for _ in range(args.runs):
        for name, fn in cases.items():  # interleaved, so drift hits every case alike
            times[name].append(per_call_ms(fn, args.repeat))
    med = {k: statistics.median(v) for k, v in times.items()}
    sizes = {"whole registry": len(generate_latest(REGISTRY)), "plugin series": len(generate_latest(plugin_only))}
    base = med["bridge, before"]
    print(f"{'case':<28} {'ms/call':>9} {'vs bridge before':>17}")
    for name, v in med.items():
        print(f"{name:<28} {v:>9.3f} {v / base:>17.3f}")
    print(f"exposition bytes: whole registry {sizes['whole registry']}, plugin series {sizes['plugin series']}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"ms_per_call": {k: round(v, 3) for k, v in med.items()},
                                           "exposition_bytes": sizes, "streams": args.streams, "runs": args.runs,
                                           "repeat": args.repeat, "python": sys.version.split()[0]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
