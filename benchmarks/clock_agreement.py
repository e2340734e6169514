"""Does the exported per-stream rate agree with what clients see?  Same streams, two sides.

For each concurrency and round: N streaming /v1/completions requests start together (the test
bed's plain aiohttp client, tests/support/load.py, timing each chunk and counting its tokens from
`continuous_usage_stats`); the plugin's histograms are scraped before and after.  Compared per
round, over every stream (none left out on either side):

* client median: definitions.stream_decode_rate on the client's chunk times (first chunk's tokens
  not counted: a coalesced first chunk did not take the interval to arrive);
* delivery median: `vllm_spark_stream_decode_tokens_per_second` (timed where the API server hands
  tokens to the request's handler), histogram_quantile(0.5) of the round's increase;
* engine median: `vllm_spark_engine_stream_decode_tokens_per_second` (vLLM's decode time, the engine
  core's clock), the same way.

Reports each round's ratios to the client's median and the median over rounds.  A benchmark, not a
gate: how close the two clocks come depends on the machine (tests/integration/test_delivery_clock.py
holds the gate, with slack).

Run: .venv/bin/python benchmarks/clock_agreement.py [--rounds 5] [--concurrency 3 8 12] [--tokens 256]
Starts a CPU `vllm serve` of the tiny test model with the plugin (1-3 minutes) unless --endpoint/--model.
Writes benchmarks/results/clock_agreement.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test bed's client and scrape helpers

from _serve import plugin_server  # noqa: E402
from support.load import measured_waves, run_streams  # noqa: E402
from support.scrape import buckets, delta_buckets, histogram_quantile, value  # noqa: E402

P = "vllm_spark_"
RESULTS = ROOT / "benchmarks" / "results"


def one_round(server, c: int, tokens: int, tag: str) -> dict:
    run = measured_waves(server, c, 1, tokens, tag)
    before, after, streams = run["before"], run["after"], run["streams"]

    def server_median(name):
        return histogram_quantile(0.5, delta_buckets(buckets(after, name), buckets(before, name)))

    rates = [s.decode_rate for s in streams if s.decode_rate is not None]
    client = statistics.median(rates) if rates else None
    delivery = server_median(P + "stream_decode_tokens_per_second")
    engine = server_median(P + "engine_stream_decode_tokens_per_second")
    count = P + "stream_decode_tokens_per_second_count"
    n_server = value(after, count) - value(before, count)
    return dict(concurrency=c, streams=len(streams), client_rated=len(rates), server_rated=n_server,
                client_median=client, delivery_median=delivery, engine_median=engine,
                first_chunk_tokens=sorted(s.first_arrival_tokens for s in streams))


def write(rows: list[dict], concurrency: list[int], out: Path) -> None:
    summary = {}
    for c in concurrency:
        mine = [x for x in rows if x["concurrency"] == c and x["client_median"]]
        if not mine:
            continue
        summary[c] = {k: statistics.median(x[k + "_median"] / x["client_median"] for x in mine)
                      for k in ("delivery", "engine")}
        print(f"c={c:3d}: median over {len(mine)} rounds of server/client median: delivery "
              f"{summary[c]['delivery']:.3f}, engine {summary[c]['engine']:.3f}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "summary": summary, "when": time.strftime("%F %T")}, indent=1))
    print(f"wrote {out}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[3, 8, 12])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--endpoint", help="a running plugin server (base URL)")
    ap.add_argument("--model", help="its served model name")
    ap.add_argument("--out", default=str(RESULTS / "clock_agreement.json"))
    a = ap.parse_args(argv)

    rows = []
    try:
        with plugin_server(a.endpoint, a.model) as server:
            run_streams(server.base_url, server.model, 2, max_tokens=16, prompt_prefix="warm-up")
            for r in range(a.rounds):
                for c in a.concurrency:
                    row = one_round(server, c, a.tokens, f"r{r}")
                    row["round"] = r
                    rows.append(row)
                    cm = row["client_median"]
                    print(f"round {r} c={c:3d}: client {cm:7.1f} tok/s  delivery {row['delivery_median']:7.1f} "
                          f"({row['delivery_median'] / cm:5.3f})  engine {row['engine_median']:7.1f} "
                          f"({row['engine_median'] / cm:5.3f})  streams {row['streams']} "
                          f"rated client/server {row['client_rated']}/{row['server_rated']:.0f}", flush=True)
    finally:
        if rows:  # keep what was measured, also when the server went away mid-run
            write(rows, a.concurrency, Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
