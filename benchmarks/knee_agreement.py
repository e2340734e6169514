"""Does the live knee agree with the knee of a sweep of the same server?  One ramp, two estimators.

Each round runs the seed-protocol sweep `tests/integration/test_knee_live.py` runs (`vllm-spark bench`,
levels 1-32, warm-up wave + 2 trials, 256 output tokens), waits one refit interval and scrapes the
plugin's live K (`vllm_spark_knee_batch_size`: the online fit of the server's own step times), then
fits K offline from the sweep's client-side points (`vllm-spark knee`).  Reports per round the two
K, their ratio and the sweep's bootstrap 95% interval, and the median ratio over rounds.

A benchmark, not a gate: both sides are wall-clock measurements on the same cores, and the client's
side moves with how late the client reads.  The estimators' agreement on steps whose timing is
controlled is the unit test `test_live_and_sweep_knee_agree_on_the_same_steps`.  Rounds share one
server; a ramp is about 4,600 steps, so the live fit's 4,096-step window holds mostly the last one.

Run: .venv/bin/python benchmarks/knee_agreement.py [--rounds 3]
Starts a CPU `vllm serve` of the tiny test model with the plugin (1-3 minutes) unless --endpoint/--model.
Writes benchmarks/results/knee_agreement.json.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test bed's scrape helpers

from _serve import plugin_server  # noqa: E402
from support.scrape import scrape, value  # noqa: E402

from vllm_spark_plugin import cli  # noqa: E402
from vllm_spark_plugin.settings import Settings  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def one_round(server, out: Path) -> dict:
    rc = cli.main(["bench", "--endpoint", server.base_url, "--model", server.model, "--api", "completions",
                   "--levels", "1,2,4,8,16,32", "--trials", "2", "--workload", "random", "--random-input-len", "16",
                   "--output-tokens", "256", "--out", str(out), "--quiet"])
    if rc != 0:
        raise SystemExit(f"the sweep failed (exit {rc}); its partial results are in {out}")
    time.sleep(Settings().knee_refit_seconds + 1.0)  # one refit interval after the ramp
    live = value(scrape(server.metrics_url), "vllm_spark_knee_batch_size")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli.main(["knee", str(out / "sweep.csv"), "--json"])
    res = json.loads(buf.getvalue())
    if "knee" not in res:  # {label: result} when several curves
        res = next(iter(res.values()))
    lo, hi = (res.get("ci") or {}).get("knee") or (None, None)
    return dict(live_knee=live, sweep_knee=res["knee"], ratio=live / res["knee"], sweep_ci=[lo, hi],
                sweep_verdict=res.get("verdict"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--endpoint", help="a running plugin server (base URL)")
    ap.add_argument("--model", help="its served model name")
    ap.add_argument("--out", default=str(RESULTS / "knee_agreement.json"))
    a = ap.parse_args(argv)

    rows = []
    try:
        with plugin_server(a.endpoint, a.model) as server, \
                tempfile.TemporaryDirectory(prefix="knee-agreement-") as tmp:
            for r in range(a.rounds):
                row = one_round(server, Path(tmp) / f"round{r}")
                row["round"] = r
                rows.append(row)
                lo, hi = row["sweep_ci"]
                print(f"round {r}: live K {row['live_knee']:6.1f}  sweep K {row['sweep_knee']:6.1f} "
                      f"(95% CI {lo if lo is None else round(lo, 1)} .. {hi if hi is None else round(hi, 1)})  "
                      f"live/sweep {row['ratio']:.3f}", flush=True)
    finally:
        if rows:  # keep what was measured, also when the server went away mid-run
            summary = {"median_ratio": statistics.median(x["ratio"] for x in rows), "rounds": len(rows)}
            print(f"median over {len(rows)} rounds of live K / sweep K: {summary['median_ratio']:.3f}")
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps({"rows": rows, "summary": summary, "when": time.strftime("%F %T")},
                                              indent=1))
            print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
