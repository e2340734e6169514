"""The SLO guard's effect on a served load: the tiny CPU server, guard off, static caps and the
guard, judged on the same loads at two floors.

1. Calibration (a fresh guard-off server, kept in --json and reused unless --recalibrate): a
   closed-loop sweep (--calibration-levels, after a warm-up) gives the single-stream rate r1 and the fit.
   The two floors are --far x r1 (0.55: far from the single-stream rate) and
   --near x r1 (0.82: close to it); the capacity at each is the sweep fit's (what a user would read
   from `vllm-spark bench` and set by hand).
2. Per floor F, per round, five servers in turn (in reverse order on every other round, so no
   server always runs first on a box whose speed drifts within minutes), each fresh: guard off; the static oracle
   (`--max-num-seqs` = the capacity at F); the guard (SPARK_PLUGIN_GUARD=admission,
   SPARK_PLUGIN_FLOORS=F) from a slow start; `prior`, the guard given the calibration sweep's
   capacity profile (SPARK_PLUGIN_PROFILE), the same sweep the static oracle's cap comes from; and
   `settled`, `--max-num-seqs` where the guard settled (the median of its caps at the end of its
   cold and warm loads at F, read from --json: hindsight, what a user trying caps around the guard's
   would keep).  On each, the loads in order: `cold` (3x closed loop on the fresh
   server), then a ramp (--ramp, --ramp-seconds per level; a static cap's stops at the cap; the
   server is now warm), `warm` (the same 3x closed loop), `poisson` (open-loop arrivals at 1.5x the capacity's request rate for
   --poisson-seconds, TTFT SLO --ttft-slo),
   `shift` (closed loop at 2x, output x4 and prompt x8 half way).  Every load is `vllm-spark bench
   --scenario overload|poisson|shift` with the load given directly (--overload-streams /
   --poisson-rate from the calibration), so the servers get the same requests.
3. The judging client runs on a core of its own (this process and the bench it starts are pinned
   to core 1; every thread of the server to core 0: a client sharing the cores with vLLM reads its
   streams in bursts), and every figure is also taken
   from the server's own SLO counters over the run (`server_*`: its clock, its TTFT SLO, set to
   --ttft-slo).

Medians of --rounds rounds per (floor, load, server).  Results merge into --json cell by cell
(floor, load, server): a run of some loads keeps the other cells, and what a run measured before a
server died is kept; the markdown table of every cell is printed and written beside it (.md).
The earlier admission figures (`runs`, `rounds`) and the prefill scenario (`prefill`) stay.

    python benchmarks/guard_effect.py                      # everything: about 2.5 hours on a quiet box
    python benchmarks/guard_effect.py --quick              # 1 round, the near floor, all loads: ~20 min
    python benchmarks/guard_effect.py --quick --servers off,static --loads warm
    python benchmarks/guard_effect.py --only prefill [--prefill-floor 120] [--prefill-streams 8]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from vllm_spark_plugin.guard.loop import parse_move
from vllm_spark_plugin.testbed.server import VllmServer, plugin_origin, prioritize_client
from vllm_spark_plugin.testbed.tiny_model import SERVED_NAME, ensure_tiny_model


def bench(server: VllmServer, out: Path, levels: str, requests: int, args, floor: float | None,
          prompt: int = 32, output: int | None = None, wait: bool = True, duration: float | None = None):
    cmd = [sys.executable, "-m", "vllm_spark_plugin.cli", "bench", "--quiet", "--endpoint", server.base_url,
           "--model", SERVED_NAME, "--api", "completions", "--mode", "closed-loop", "--levels", levels,
           "--trials", "1", "--no-warmup", *(["--requests", str(requests)] if requests else []),
           *(["--duration", f"{duration:g}"] if duration else []), "--workload", "random",
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


def guard_moves(log_path: Path, offset: int = 0) -> tuple[int | None, dict[str, int]]:
    """(the cap the last move set, moves per rule) from the engine core's 'SLO guard cap' lines written
    past byte `offset` of the server's log (one line a move, naming its rule: guard/loop.py's RULES)."""
    cap, rules = None, {}
    with open(log_path, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        move = parse_move(line) if "SLO guard cap" in line else None
        if move is not None:
            cap = move[1]
            rules[move[2]] = rules.get(move[2], 0) + 1
    return cap, rules


def median(values):
    vals = sorted(v for v in values if v is not None)
    return statistics.median(vals) if vals else None



# ----------------------------------------------------------------------------- the admission matrix
LOADS = ("cold", "warm", "poisson", "shift")
# prior: the guard with the calibration sweep's profile; settled: --max-num-seqs where the guard settled;
# guard-b: the guard with the plugin imported from --guard-b (another version, right after `guard`)
SERVERS = ("off", "static", "guard", "guard-b", "prior", "settled")
GUARDS = ("guard", "guard-b", "prior")
STATIC = ("static", "settled")  # servers with a fixed --max-num-seqs and no guard
FLOOR_LABELS = ("far", "near")
SERVER_CORE, CLIENT_CORE = 0, 1
FIGURES = ("rate_met_share", "slo_met_share", "ttft_met_share", "rate_goodput_tokens_per_second",
           "slo_goodput_tokens_per_second", "ttft_p50_s", "ttft_p99_s", "output_tokens_per_second",
           "per_stream_median_tokens_per_second", "requests", "completed", "errors", "bunched_streams", "seconds",
           "streams", "arrival_rate_per_second", "server_requests", "server_rate_met_share", "server_slo_met_share",
           "server_rate_goodput_tokens_per_second", "server_slo_goodput_tokens_per_second", "guard_limit",
           "guard_requests_held", "guard_mean_wait_s")


def pin_self(core: int) -> bool:
    """This process (and the bench processes it starts) on `core` only; False where the box has no
    second core to give."""
    if len(os.sched_getaffinity(0)) < 2:
        return False
    os.sched_setaffinity(0, {core})
    return True


def pin_server(server: VllmServer, core: int) -> int:
    """Every thread of every process of the server's session (API server, engine cores, workers) on
    `core`; threads they start later inherit it.  Returns how many threads were pinned."""
    pinned = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != server.proc.pid:
                continue
            for task in (entry / "task").iterdir():
                os.sched_setaffinity(int(task.name), {core})
                pinned += 1
        except (OSError, ValueError):
            continue  # gone meanwhile
    return pinned


def start(model: str, log: Path, env: dict, extra: list[str] | None = None, pinned: bool = True,
          cwd: Path | None = None) -> VllmServer:
    server = VllmServer(model_path=model, env=env, extra_args=extra or [], log_path=log, cwd=cwd)
    if pinned:  # the server inherits core 0 (vLLM binds its compute threads within what it is allowed)
        os.sched_setaffinity(0, {SERVER_CORE})
    try:
        server.start(timeout=900)
    finally:
        if pinned:
            os.sched_setaffinity(0, {CLIENT_CORE})
    server.prioritize_frontend()
    if pinned:
        pin_server(server, SERVER_CORE)
    return server


def whole_floor(rate: float) -> float:
    return float(max(1, round(rate)))  # any positive floor is an SLO; whole tok/s read better in the table


def calibrate(args, model: str, work: Path, pinned: bool) -> dict:
    """A fresh guard-off server, a closed-loop sweep: the single-stream rate, the fit, the two floors
    and the capacity at each (the fit of the sweep's points: what a user would set by hand)."""
    from vllm_spark_plugin.definitions import SweepPoint
    from vllm_spark_plugin.knee.fit import fit_points
    server = start(model, work / "calibration.log", {"SPARK_PLUGIN_GUARD": "off"}, pinned=pinned)
    try:  # a warm-up first: a fresh server's first requests are slow, and level 1 sets the floors
        bench(server, work / "calibration-warmup", "8", 16, args, None, prompt=args.prompt_tokens)
        rows = bench(server, work / "calibration", args.calibration_levels, None, args, None,
                     prompt=args.prompt_tokens)
    finally:
        server.stop()
    points = [SweepPoint(concurrency=float(r["concurrency"]), per_stream_tokens_per_second=float(r["per_stream_median_tps"]),
                         aggregate_tokens_per_second=float(r["aggregate_tps"])) for r in rows]
    single = next(p.per_stream_tokens_per_second for p in points if p.concurrency == 1)
    floors = {"far": whole_floor(args.far * single), "near": whole_floor(args.near * single)}
    fit = fit_points(points, floors=tuple(floors.values()), bootstrap=0)
    capacity = {label: fit.capacity_at(f) for label, f in floors.items()}
    if not all(capacity.values()):
        raise RuntimeError(f"the calibration sweep gives no capacity at {floors}: {capacity} (fit {fit})")
    profile = json.loads((work / "calibration" / "capacity_profile.json").read_text())
    return {"single_stream_tps": single, "alpha_s": fit.alpha_seconds, "beta_s": fit.beta_seconds,
            "knee": fit.knee, "profile": profile, "floors": floors, "capacity": capacity,
            "points": [{"concurrency": p.concurrency, "per_stream_tps": p.per_stream_tokens_per_second,
                        "aggregate_tps": p.aggregate_tokens_per_second} for p in points]}


def write_profile(cal: dict, path: Path) -> Path:
    """The calibration sweep's capacity profile (what `vllm-spark bench` wrote), for the `prior` server."""
    if "profile" not in cal:
        raise SystemExit("the calibration in --json has no capacity profile (kept from an older run): --recalibrate")
    path.write_text(json.dumps(cal["profile"], indent=2) + "\n")
    return path


def load_args(load: str, floor: float, cap: int, args, round_index: int) -> tuple[str, list[str]]:
    """`vllm-spark bench` scenario and options for one load at the capacity `cap` at `floor`."""
    common = ["--slo-floor", f"{floor:g}", "--slo-ttft", f"{args.ttft_slo:g}", "--output-tokens",
              str(args.output_tokens), "--workload", "random", "--random-input-len", str(args.prompt_tokens),
              "--seed", str(round_index)]
    if load == "poisson":
        rate = args.poisson * cap * floor / args.output_tokens
        # arrivals for --poisson-seconds: a few seconds of them never build the queue 1.5x brings
        n = max(args.min_requests, round(rate * args.poisson_seconds))
        return "poisson", common + ["--poisson-rate", f"{rate:.4f}", "--overload-requests", str(n)]
    factor = args.shift_factor if load == "shift" else args.closed
    streams = max(1, round(factor * cap))
    n = max(args.min_requests, 3 * streams)
    return ("shift" if load == "shift" else "overload"), common + [
        "--overload-streams", str(streams), "--overload-requests", str(n)]


def measure(server: VllmServer, load: str, floor: float, cap: int, args, out: Path, round_index: int) -> dict:
    name, extra = load_args(load, floor, cap, args, round_index)
    offset = server.log_path.stat().st_size if server.log_path.exists() else 0
    r = scenario(server, out, name, args, *extra)
    row = {k: r.get(k) for k in FIGURES}
    if load == "shift":
        row["after_rate_met_share"] = r["phases"]["after"]["rate_met_share"]
        row["after_ttft_p99_s"] = r["phases"]["after"]["ttft_p99_s"]
    row["guard_cap_logged"], row["cap_moves"] = guard_moves(server.log_path, offset)
    return row


class Matrix:
    """The cells (floor, load, server) of --json, merged: a cell measured in this run replaces its
    earlier rounds; every other cell stays.  Saved after every measurement."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}
        self.m = self.data.setdefault("matrix", {"cells": {}})
        self.touched: set[str] = set()

    def add(self, label: str, floor: float, cap: int, load: str, mode: str, row: dict | None, error: str | None = None):
        key = f"{label}/{load}/{mode}"
        cell = self.m["cells"].get(key)
        if key not in self.touched or cell is None:
            cell = self.m["cells"][key] = {"floor_label": label, "floor": floor, "capacity": cap, "load": load,
                                           "server": mode, "rounds": [], "errors": []}
            self.touched.add(key)
        if row is not None:
            cell["rounds"].append(row)
        if error is not None:
            cell["errors"].append(error)
        cell["median"] = {k: median(r.get(k) for r in cell["rounds"]) for k in
                          dict.fromkeys(k for r in cell["rounds"] for k in r)
                          if all(isinstance(r.get(k), (int, float, type(None))) for r in cell["rounds"])}
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")
        md = self.markdown()
        self.path.with_suffix(".md").write_text(md)

    def markdown(self) -> str:
        cal = self.m.get("calibration") or {}
        out = ["# SLO guard on the CPU server: guard off, static caps and the guard (servers: " + ", ".join(SERVERS) + ")", "",
               f"`benchmarks/guard_effect.py` (results: `{self.path.name}`, key `matrix`). Medians over the rounds; "
               "shares are of all offered requests; `server` figures are the server's own SLO counters over the run.", ""]
        if cal:
            out += [f"Calibration (guard off, closed-loop sweep): single-stream rate {cal['single_stream_tps']:.0f} tok/s, "
                    f"alpha {1e3 * cal['alpha_s']:.2f} ms, beta {1e3 * cal['beta_s']:.3f} ms; floors "
                    + ", ".join(f"{k} {cal['floors'][k]:g} tok/s (capacity {cal['capacity'][k]})" for k in cal["floors"]), ""]
        cells = self.m["cells"]

        def pct(v):
            return "-" if v is None else f"{100 * v:.0f}%"

        def num(v, spec=".0f"):
            return "-" if v is None else format(v, spec)
        for label in FLOOR_LABELS:
            mine = [c for c in cells.values() if c["floor_label"] == label]
            if not mine:
                continue
            out += [f"## Floor {mine[0]['floor']:g} tok/s ({label}; capacity {mine[0]['capacity']} streams, "
                    f"TTFT SLO {self.data.get('matrix_args', {}).get('ttft_slo', '?')} s)", "",
                    "| load | server | at the floor | both SLOs | rate goodput tok/s | TTFT p50 / p99 s | aggregate tok/s "
                    "| server: floor / both | cap, held (mean wait s) | rounds |",
                    "|---|---|---|---|---|---|---|---|---|---|"]
            for load in LOADS:
                for mode in SERVERS:
                    c = cells.get(f"{label}/{load}/{mode}")
                    if c is None:
                        continue
                    m = c.get("median", {})
                    fixed = m.get("max_num_seqs") or (c["capacity"] if mode == "static" else None)
                    guard = (f"{num(m.get('guard_limit'))}, {num(m.get('guard_requests_held'))} "
                             f"({num(m.get('guard_mean_wait_s'), '.2f')})" if m.get("guard_limit") is not None
                             else f"--max-num-seqs {fixed}" if fixed else "-")
                    failed = f" ({len(c['errors'])} failed)" if c["errors"] else ""
                    out.append(f"| {load} | {mode} | {pct(m.get('rate_met_share'))} | {pct(m.get('slo_met_share'))} | "
                               f"{num(m.get('rate_goodput_tokens_per_second'))} | {num(m.get('ttft_p50_s'), '.2f')} / "
                               f"{num(m.get('ttft_p99_s'), '.2f')} | {num(m.get('output_tokens_per_second'))} | "
                               f"{pct(m.get('server_rate_met_share'))} / {pct(m.get('server_slo_met_share'))} | {guard} | "
                               f"{len(c['rounds'])}{failed} |")
            out.append("")
        return "\n".join(out)


def plot(cells: dict, cal: dict, path: Path) -> Path | None:
    """guard_effect.png: per floor, the rate goodput of each server on each load (medians), each bar
    labelled with its share of requests at the floor: what the table says, at a glance."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [lb for lb in FLOOR_LABELS if any(c["floor_label"] == lb for c in cells.values())]
    if not labels:
        return None
    fig, axes = plt.subplots(len(labels), 1, figsize=(9, 3.6 * len(labels)), squeeze=False)
    width = 0.8 / len(SERVERS)
    for ax, label in zip(axes[:, 0], labels):
        loads = [ld for ld in LOADS if any(f"{label}/{ld}/{s}" in cells for s in SERVERS)]
        for i, mode in enumerate(SERVERS):
            for j, load in enumerate(loads):
                c = cells.get(f"{label}/{load}/{mode}")
                m = (c or {}).get("median") or {}
                good, share = m.get("rate_goodput_tokens_per_second"), m.get("rate_met_share")
                if good is None:
                    continue
                x = j + (i - (len(SERVERS) - 1) / 2) * width
                ax.bar(x, good, width, color=f"C{i}", label=mode if j == 0 else None)
                ax.annotate("-" if share is None else f"{100 * share:.0f}%", (x, good), ha="center", va="bottom",
                            fontsize=7, xytext=(0, 2), textcoords="offset points")
        ax.margins(y=0.12)  # room for the labels above the tallest bar
        ax.set_xticks(range(len(loads)), loads)
        floor = cal.get("floors", {}).get(label)
        ax.set_title(f"floor {floor:g} tok/s ({label}; --max-num-seqs {cal.get('capacity', {}).get(label)} for the static "
                     f"oracle): rate goodput, and the share of requests at the floor", fontsize=9)
        ax.set_ylabel("rate goodput (tok/s)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncols=len(SERVERS))
    fig.suptitle(f"SLO guard on the CPU server (single stream {cal.get('single_stream_tps', 0):.0f} tok/s; medians "
                 "of the rounds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def settled_cap(cells: dict, label: str) -> int | None:
    """The `settled` server's --max-num-seqs: the median of the guard's caps at the end of its closed
    loops (cold and warm) at this floor, the cap a user trying caps by hand around the guard's would
    keep (hindsight); None while those cells are not measured."""
    caps = [r["guard_limit"] for ld in ("cold", "warm") for r in
            (cells.get(f"{label}/{ld}/guard") or {}).get("rounds", []) if r.get("guard_limit")]
    return max(1, round(median(caps))) if caps else None


def run_server(mode: str, label: str, floor: float, cap: int, loads: list[str], k: int, args, model: str,
               work: Path, matrix: Matrix, pinned: bool, profile: Path, static_cap: int | None = None) -> None:
    """One fresh server (guard off, a static --max-num-seqs, the guard, or the guard with the sweep's
    profile) through `loads` in order, each load sized by the calibration's `cap`; a server that dies
    costs only its remaining loads (recorded as errors)."""
    env = {"SPARK_PLUGIN_GUARD": "admission" if mode in GUARDS else "off",
           "SPARK_PLUGIN_FLOORS": f"{floor:g}",
           "SPARK_PLUGIN_TTFT_SLO_SECONDS": f"{args.ttft_slo:g}", "SPARK_PLUGIN_KNEE_REFIT_SECONDS": "2"}
    if mode == "prior":
        env["SPARK_PLUGIN_PROFILE"] = str(profile)
    cwd = None
    if mode == "guard-b":  # the other version's package first on the path, in the API server and the engine core
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(args.guard_b), os.environ.get("PYTHONPATH")) if x)
        cwd = args.guard_b  # started from this checkout, `python -m` would put its package ahead of PYTHONPATH
    static_cap = (static_cap or cap) if mode in STATIC else None
    extra = ["--max-num-seqs", str(static_cap)] if static_cap else []
    tag = f"{label}-{mode}-{k}"
    todo = list(loads)
    server = None
    try:
        server = start(model, work / f"{tag}.log", env, extra, pinned, cwd)
        warm = False
        while todo:
            load = todo[0]
            if load != "cold" and not warm:  # a static cap's ramp stops at the cap: above it requests only queue
                levels = args.ramp if not static_cap else ",".join(
                    x for x in args.ramp.split(",") if int(x) <= static_cap) or "1"
                bench(server, work / f"ramp-{tag}", levels, None, args, None, prompt=args.prompt_tokens,
                      duration=args.ramp_seconds)
                warm = True
            row = measure(server, load, floor, cap, args, work / f"{tag}-{load}", k)
            row["max_num_seqs"] = static_cap
            todo.pop(0)
            matrix.add(label, floor, cap, load, mode, row)
            print(f"{label} {floor:g} tok/s, {load}, {mode}, round {k + 1}: " + json.dumps(
                {x: row.get(x) for x in ("rate_met_share", "slo_met_share", "rate_goodput_tokens_per_second",
                                         "ttft_p50_s", "ttft_p99_s", "output_tokens_per_second",
                                         "server_rate_met_share", "guard_limit", "bunched_streams")}), flush=True)
    except Exception as exc:  # noqa: BLE001 - keep what was measured, say what failed, go on
        why = f"{type(exc).__name__}: {str(exc)[-600:]}"
        print(f"{tag}: failed ({why}); {len(todo)} load(s) not measured", flush=True)
        for load in todo:
            matrix.add(label, floor, cap, load, mode, None, why)
    finally:
        if server is not None:
            server.stop()


def matrix_main(args, model: str, work: Path) -> int:
    out_json = Path(args.json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    matrix = Matrix(out_json)
    pinned = pin_self(CLIENT_CORE)
    if not pinned:
        print("one core only: the client is not pinned apart from the server; its timings may be bursty", flush=True)
    matrix.data["matrix_args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"}
    cal = matrix.m.get("calibration")
    if cal is None or args.recalibrate:
        cal = matrix.m["calibration"] = calibrate(args, model, work, pinned)
        matrix.save()
    print(f"calibration: single stream {cal['single_stream_tps']:.0f} tok/s; floors {cal['floors']}, "
          f"capacities {cal['capacity']}", flush=True)
    profile = write_profile(cal, work / "capacity_profile.json")
    # fixed for the run, from the guard's cells in --json before it (or, without them, from the guard's
    # first round in this run)
    settled = {label: settled_cap(matrix.m["cells"], label) for label in args.floors}
    if "settled" in args.servers:
        print(f"settled servers' --max-num-seqs: {settled} (None: from the guard's first round here)", flush=True)
    for k in range(args.rounds):
        for label in args.floors:
            floor, cap = cal["floors"][label], cal["capacity"][label]
            for mode in (args.servers if k % 2 == 0 else args.servers[::-1]):
                if mode == "settled" and settled[label] is None:
                    settled[label] = settled_cap(matrix.m["cells"], label)
                    if settled[label] is None:
                        raise SystemExit(f"the settled server at the {label} floor needs the guard's cold or warm "
                                         "cells there (add guard to --servers, or run it first): none in the results")
                    print(f"settled server at the {label} floor: --max-num-seqs {settled[label]}", flush=True)
                run_server(mode, label, floor, cap, args.loads, k, args, model, work, matrix, pinned, profile,
                           settled.get(label) if mode == "settled" else None)
    md = matrix.markdown()
    print(md)
    print(f"plot: {plot(matrix.m['cells'], cal, out_json.with_suffix('.png'))}")
    return 0


def _names(allowed):
    def parse(text: str) -> list[str]:
        vals = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in vals if v not in allowed]
        if bad or not vals:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}, got {text!r}")
        return [v for v in allowed if v in vals]  # in the harness's order (cold first)
    return parse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round, the near floor (unless --floors): about 20 minutes")
    p.add_argument("--floors", type=_names(FLOOR_LABELS), default=None, help="far,near (default: both; --quick: near)")
    p.add_argument("--loads", type=_names(LOADS), default=list(LOADS), help="cold,warm,poisson,shift (default: all)")
    p.add_argument("--servers", type=_names(SERVERS), default=[s for s in SERVERS if s != "guard-b"],
                   help="off,static,guard,guard-b,prior,settled (default: all but guard-b; settled needs the guard's cells)")
    p.add_argument("--guard-b", type=Path, default=None, metavar="DIR",
                   help="guard-b imports the plugin from DIR (a checkout or worktree of another version): the two "
                        "loops interleaved on the same box, whose speed moves between rounds")
    p.add_argument("--rounds", type=int, default=None, help="rounds per cell (default 3; --quick: 1)")
    p.add_argument("--recalibrate", action="store_true", help="sweep again instead of reusing the calibration in --json")
    p.add_argument("--far", type=float, default=0.55, help="far floor as a fraction of the single-stream rate")
    p.add_argument("--near", type=float, default=0.82, help="near floor as a fraction of the single-stream rate")
    p.add_argument("--calibration-levels", default="1,2,4,8,16,32,64")
    p.add_argument("--closed", type=float, default=3.0, help="cold, warm: closed-loop streams x the capacity")
    p.add_argument("--poisson", type=float, default=1.5, help="poisson: arrival rate x the capacity's request rate")
    p.add_argument("--poisson-seconds", type=float, default=30.0, help="poisson: seconds of arrivals")
    p.add_argument("--shift-factor", type=float, default=2.0, help="shift: closed-loop streams x the capacity")
    p.add_argument("--min-requests", type=int, default=48, help="requests per load at least")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--ramp", default="1,2,4,8,16,32,64,128")
    p.add_argument("--ramp-requests", type=int, default=48, help="prefill: requests per ramp level")
    p.add_argument("--ramp-seconds", type=float, default=4.0,
                   help="admission matrix: seconds of new requests per ramp level (in-flight ones finish)")
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--ttft-slo", type=float, default=2.0, help="TTFT SLO, seconds (a TTFT bucket bound)")
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "guard_effect.json"))
    p.add_argument("--only", choices=("prefill",), help="the prefill-interference scenario instead (kept in --json)")
    p.add_argument("--prefill-floor", type=float, default=120.0)
    p.add_argument("--prefill-streams", type=int, default=8)
    args = p.parse_args(argv)
    if ("guard-b" in args.servers) != (args.guard_b is not None):
        p.error("--servers guard-b and --guard-b DIR go together")
    if args.guard_b is not None and not (args.guard_b / "vllm_spark_plugin" / "__init__.py").is_file():
        p.error(f"--guard-b {args.guard_b}: no vllm_spark_plugin package there")
    if args.guard_b is not None:
        args.guard_b = args.guard_b.resolve()
        got = plugin_origin(sys.executable, args.guard_b, {"PYTHONPATH": str(args.guard_b)})
        if got != args.guard_b / "vllm_spark_plugin":
            p.error(f"--guard-b {args.guard_b}: a server started there imports the plugin from {got}")
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.floors = args.floors or (["near"] if args.quick else list(FLOOR_LABELS))
    model = str(ensure_tiny_model())
    work = Path(tempfile.mkdtemp(prefix="guard-"))
    print(f"server logs and bench outputs: {work}", flush=True)
    prioritize_client()
    if args.only != "prefill":
        return matrix_main(args, model, work)
    out_json = Path(args.json)
    kept = json.loads(out_json.read_text()) if out_json.exists() else {}
    kept["prefill"] = prefill_scenario(args, model, work, args.prefill_floor)
    out_json.write_text(json.dumps(kept, indent=2) + "\n")
    for mode in ("off", "prefill"):
        r = kept["prefill"][mode]
        print(f"{mode:>8} (median of {args.rounds}): slowest stream over the prefill {r['slowest_tps']} tok/s "
              f"(median {r['median_tps']}, baseline {r['baseline_tps']}), window {r['window_s']} s, long prompt "
              f"TTFT {r['long_prompt_ttft_s']} s, completed {r['long_completed']}, budget {r['prefill_budget_tokens']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
