"""What routing on the plugin's load buys: the same load through vLLM's router (`vllm-router`
0.1.17, scripts/router-env.sh) with `--policy power_of_two` (it reads each server's GET /get_load)
and with `--policy round_robin` (it reads nothing), in front of two CPU servers of the tiny model with
the plugin.

The fleet is uneven the way fleets are: server B also carries a neighbour's traffic that does not
pass the router (--background streams sent to B directly), server A does not.  The routed load is
--routed closed-loop streams of --output-tokens tokens through the router.  Per policy and round,
both servers' own SLO counters are read over the window (their clock, their TTFT SLO
--ttft-slo and floor --floor): the share of finished requests that met both SLOs and the goodput
(output tokens/s of those requests), for the fleet (routed and background together) and the share of
the routed requests each server got (vllm-router's own counters).  Medians of --rounds rounds.
Not a gate: a benchmark (ratios side by side); the servers share this machine's cores.

    python benchmarks/router_effect.py                       # 3 rounds of 30 s per policy: ~15 min here
    python benchmarks/router_effect.py --rounds 1 --seconds 15
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from vllm_spark_plugin.metrics import names as n
from vllm_spark_plugin.testbed.router import Router
from vllm_spark_plugin.testbed.server import VllmServer, prioritize_client
from vllm_spark_plugin.testbed.tiny_model import ensure_tiny_model

POLICIES = ("power_of_two", "round_robin")


async def _stream(session, url: str, model: str, tokens: int, tag: str) -> None:
    body = {"model": model, "prompt": f"{tag}: tell me about the sea.", "max_tokens": tokens,
            "temperature": 0.0, "stream": True, "ignore_eos": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for _ in resp.content:
            pass


async def _closed_loop(session, url, model, streams, tokens, deadline, tag) -> int:
    async def worker(w):
        done = 0
        while time.monotonic() < deadline:
            try:
                await _stream(session, url, model, tokens, f"{tag} {w} {done}")
            except (aiohttp.ClientError, asyncio.TimeoutError):  # a dropped stream: the servers' counters judge it
                await asyncio.sleep(0.1)
                continue
            done += 1
        return done
    return sum(await asyncio.gather(*(worker(w) for w in range(streams))))


def drive(routed_url, background_url, model, args) -> int:
    async def main():
        deadline = time.monotonic() + args.seconds
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=args.seconds + 300)) as s:
            routed, _ = await asyncio.gather(
                _closed_loop(s, routed_url, model, args.routed, args.output_tokens, deadline, "routed"),
                _closed_loop(s, background_url, model, args.background, args.output_tokens, deadline, "neighbour"))
            return routed
    return asyncio.run(main())


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _slo(samples, name: str, floor: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (metric, labels), v in samples.items():
        lab = dict(labels)
        if metric == name and lab.get("floor") == floor:
            out[lab["outcome"]] = out.get(lab["outcome"], 0.0) + v
    return out


def _sample_loads(servers, stop, out) -> None:
    """What each server answers on /get_load while the round runs (every 0.5 s)."""
    import urllib.request
    while not stop.is_set():
        for s in servers:
            with urllib.request.urlopen(s.base_url + "/get_load", timeout=5) as r:
                out.setdefault(s.base_url, []).append(json.loads(r.read())["load"])
        stop.wait(0.5)


def one_round(servers, router, policy, args) -> dict:
    import threading
    floor = f"{args.floor:g}"
    before = [_scrape(s.metrics_url) for s in servers]
    r_before = _scrape(router.metrics_url)
    loads: dict[str, list[int]] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_loads, args=(servers, stop, loads), daemon=True)
    sampler.start()
    t0 = time.monotonic()
    routed = drive(router.base_url, servers[1].base_url, servers[0].model, args)
    seconds = time.monotonic() - t0
    stop.set()
    sampler.join()
    time.sleep(1.0)
    after = [_scrape(s.metrics_url) for s in servers]
    r_after = _scrape(router.metrics_url)
    req = {o: sum(_slo(a, n.SLO_REQUESTS, floor).get(o, 0) - _slo(b, n.SLO_REQUESTS, floor).get(o, 0)
                  for a, b in zip(after, before)) for o in ("met", "missed_ttft", "missed_rate", "missed_both")}
    tok = {o: sum(_slo(a, n.SLO_OUTPUT_TOKENS, floor).get(o, 0) - _slo(b, n.SLO_OUTPUT_TOKENS, floor).get(o, 0)
                  for a, b in zip(after, before)) for o in ("met",)}
    to_worker = {}
    for s in servers:
        key = ("vllm_router_processed_requests_total", (("worker", s.base_url),))
        to_worker[s.base_url] = r_after.get(key, 0.0) - r_before.get(key, 0.0)
    total = sum(req.values())
    routed_total = sum(to_worker.values()) or 1.0
    return {"policy": policy, "seconds": round(seconds, 1), "routed_requests": routed,
            "finished_requests": total, "met_share": req["met"] / total if total else None,
            "goodput_tokens_per_second": tok["met"] / seconds,
            "routed_share_to_busy_server": to_worker[servers[1].base_url] / routed_total, "outcomes": req,
            "median_load": {name: statistics.median(loads.get(s.base_url) or [0]) for name, s in zip("ab", servers)},
            "slo_capacity": {name: _capacity(a) for name, a in zip("ab", after)}}


def _capacity(samples) -> dict[str, float]:
    return {dict(lab)["floor"]: v for (metric, lab), v in samples.items() if metric == n.SLO_CAPACITY}


def warm(servers, args) -> None:
    """Each server's fit gets a verdict: one stream alone, then 16 at once, then a refit."""
    model = servers[0].model
    for streams in (1, 16):
        async def main(streams=streams):
            deadline = time.monotonic() + 10
            async with aiohttp.ClientSession() as s:
                await asyncio.gather(*(_closed_loop(s, sv.base_url, model, streams, 32, deadline, "warm") for sv in servers))
        asyncio.run(main())
    time.sleep(3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--routed", type=int, default=8, help="closed-loop streams through the router")
    p.add_argument("--background", type=int, default=16, help="closed-loop streams sent to server B directly")
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--floor", type=float, default=48.0, help="per-stream floor, tok/s (a bucket bound)")
    p.add_argument("--ttft-slo", type=float, default=2.0, help="TTFT SLO, seconds (a bucket bound)")
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "router_effect.json"))
    args = p.parse_args(argv)
    prioritize_client()
    env = {"SPARK_PLUGIN_FLOORS": f"{args.floor:g}", "SPARK_PLUGIN_TTFT_SLO_SECONDS": f"{args.ttft_slo:g}",
           "SPARK_PLUGIN_KNEE_REFIT_SECONDS": "2"}
    model = str(ensure_tiny_model())
    servers = [VllmServer(model_path=model, env=env, log_path=Path(f"/tmp/router-effect-{x}.log")) for x in "ab"]
    rounds: list[dict] = []
    stopped = None
    try:
        for s in servers:
            s.start(timeout=900)
        warm(servers, args)
        for k in range(args.rounds):
            for policy in POLICIES:
                with Router([s.base_url for s in servers], policy=policy, poll_seconds=1) as router:
                    time.sleep(2)  # the router's first polls
                    r = one_round(servers, router, policy, args)
                r["round"] = k + 1
                rounds.append(r)
                print(json.dumps(r), flush=True)
    except Exception as exc:  # keep the rounds measured so far
        stopped = f"{type(exc).__name__}: {exc}"
        print(f"router_effect: stopped after {len(rounds)} round(s): {stopped}", file=sys.stderr)
    finally:
        for s in servers:
            s.stop()
    summary = {}
    for policy in POLICIES:
        mine = [r for r in rounds if r["policy"] == policy]
        if not mine:
            continue
        summary[policy] = {key: statistics.median(r[key] for r in mine if r[key] is not None)
                           for key in ("met_share", "goodput_tokens_per_second", "routed_share_to_busy_server",
                                       "finished_requests") if any(r[key] is not None for r in mine)}
    result = {"what": "the same load through vllm-router 0.1.17 with power_of_two on the plugin's /get_load and "
                      "with round_robin; two CPU servers of the tiny model, server B also carrying direct traffic",
              "settings": {k: v for k, v in vars(args).items() if k != "json"},
              "median_of_rounds": summary, "rounds": rounds, "stopped": stopped}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    for policy, m in summary.items():
        print(f"{policy:>13}: met both SLOs {m.get('met_share')}, goodput {m.get('goodput_tokens_per_second')} tok/s, "
              f"routed share to the busy server {m.get('routed_share_to_busy_server')}")
    return 0 if stopped is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
