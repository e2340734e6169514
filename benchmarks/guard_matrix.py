"""The SLO guard's scenario matrix on the simulated plant (tests/support/plant.py): every scenario run
guard off, with the best static max_num_seqs (searched on the same plant) and with each registered
admission policy.  Deterministic (seeded), a few seconds of CPU.

    python benchmarks/guard_matrix.py            # writes benchmarks/results/guard_matrix.json and the
                                                 # table between the markers in docs/guard.md
    python benchmarks/guard_matrix.py --check    # exit 1 if docs/guard.md's table is not what this gives
    python benchmarks/guard_matrix.py --seeds 2 3   # the gates each policy misses on other seeds (no file written)
    python benchmarks/guard_matrix.py --seeds 1 2 --drift 0.2 20 --refit 2   # ... on a drifting host
    python benchmarks/guard_matrix.py --seeds 1 2 --slow 2 20 50   # ... on a host at half speed from 20 to 50 s
    python benchmarks/guard_matrix.py --seeds 1 2 --tuned-elsewhere   # ... and what a static cap tuned by
                                                 # sweep on another day misses (the yardstick a user reaches)
    python benchmarks/guard_matrix.py --seeds 1 2 3 --rules   # ... and which rules moved each policy's cap
                                                 # (guard/loop.py's RULES), per scenario over the seeds

tests/unit/test_guard_matrix.py gates each scenario and checks docs/guard.md's table against this.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the plant and the matrix: tests/support

from support import guard_matrix as matrix  # noqa: E402

DOC = ROOT / "docs" / "guard.md"
OUT = ROOT / "benchmarks" / "results" / "guard_matrix.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare docs/guard.md's table")
    ap.add_argument("--seeds", type=int, nargs="+", help="run every scenario on these seeds and list the gates "
                    "each policy misses (writes nothing)")
    ap.add_argument("--drift", type=float, nargs=2, metavar=("SIGMA", "TAU"),
                    help="with --seeds: every engine's speed drifting (log-scale std, seconds correlated)")
    ap.add_argument("--slow", type=float, nargs=3, metavar=("FACTOR", "START", "END"),
                    help="with --seeds: every step FACTOR times as long from START to END seconds (a host "
                    "that slows within a minute and comes back)")
    ap.add_argument("--refit", type=float, metavar="SECONDS", help="with --seeds: the guard's refit period")
    ap.add_argument("--tuned-elsewhere", action="store_true", help="with --seeds: also the gates a static cap "
                    "tuned on another day (the best static cap of seed + 1000) misses")
    ap.add_argument("--rules", action="store_true", help="with --seeds: also the moves of each policy's cap per "
                    "rule, per scenario, summed over the seeds (closed-loop scenarios; an open one runs many rates)")
    args = ap.parse_args(argv)
    if (args.drift or args.slow or args.refit or args.tuned_elsewhere or args.rules) and not args.seeds:
        ap.error("--drift, --slow, --refit, --tuned-elsewhere and --rules go with --seeds (the table is the plant "
                 "as it is)")
    matrix.vary(tuple(args.drift) if args.drift else None, args.refit, tuple(args.slow) if args.slow else None)
    t0 = time.process_time()
    if args.seeds:
        totals: dict[str, int] = {}
        rules: dict[tuple[str, str], dict[str, int]] = {}
        for seed in args.seeds:
            matrix.reseed(seed)
            ways = {p: (lambda p=p: matrix.short_gates(p)) for p in matrix.policies()}
            if args.tuned_elsewhere:
                ways["static tuned elsewhere"] = matrix.short_gates_tuned_elsewhere
            for way, gates in ways.items():
                short = gates()
                totals[way] = totals.get(way, 0) + len(short)
                print(f"seed {seed}, {way}: {len(short)} gate(s) short" + "".join(f"\n  {x}" for x in short),
                      flush=True)
            for p in matrix.policies() if args.rules else ():
                for s in matrix.SCENARIOS:
                    o = matrix.outcome(s.name, p).get("outcome")
                    for rule, n in (o.rules if o is not None else {}).items():
                        tally = rules.setdefault((p, s.name), {})
                        tally[rule] = tally.get(rule, 0) + n
        print("; ".join(f"{way}: {n} gate(s) short in all" for way, n in totals.items()))
        for (p, name), tally in rules.items():
            print(f"{p}, {name}: the cap's moves over {len(args.seeds)} seed(s): "
                  + ", ".join(f"{rule} {n}" for rule, n in sorted(tally.items(), key=lambda kv: -kv[1])))
        return 0
    rows = matrix.table()
    table_md = matrix.markdown(rows)
    text = DOC.read_text(encoding="utf-8")
    new = matrix.replace_block(text, table_md)
    if args.check:
        print("docs/guard.md's matrix table is current" if new == text else "docs/guard.md's matrix table is stale")
        return 0 if new == text else 1
    DOC.write_text(new, encoding="utf-8")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"engine": matrix.ENGINE.__dict__, "lone_stream_rate": round(matrix.LONE, 3),
                               "ttft_slo_seconds": matrix.TTFT_SLO, "scenarios": rows}, indent=1) + "\n",
                   encoding="utf-8")
    print(table_md)
    print(f"{len(rows)} scenarios in {time.process_time() - t0:.1f} s of CPU; wrote {OUT.relative_to(ROOT)} and "
          f"the table in {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
