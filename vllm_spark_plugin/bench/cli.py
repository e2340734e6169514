"""`vllm-spark bench`: concurrency sweep with the seed protocol, reports and a capacity profile.

Exit status: 0 complete; 1 the endpoint could not be benchmarked (preflight: wrong URL, server
down, model not served); 2 bad options; 3 the server failed during the run (it stopped answering,
failed every request of a trial, or failed a scenario's request; partial results written);
130 interrupted (Ctrl-C; partial results written).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from datetime import datetime
from pathlib import Path

from .._version import __version__
from ..definitions import LatencySLO
from . import scenarios as S
from .client import OpenAIStreamClient, Timeouts, normalize_endpoint
from .overload import LOAD_SCENARIOS, LoadConfig, overload_line, run_load, shifted_workload
from .progress import Progress
from .results import (CSV_COLUMNS, CSV_NAME, META_NAME, STREAM_COLUMNS, STREAMS_NAME, CsvWriter, RunRecord,
                      write_json)
from .server_info import PreflightError, ServerInfo, collect, metrics_text, preflight, tokenize
from .adaptive import Budget, BudgetError, SearchConfig
from .sweep import DEFAULT_LEVELS, EndpointTarget, ServerGone, SweepConfig, SweepRunner, now_iso
from .workloads import WORKLOAD_NAMES, ContextError, PromptFactory, Workload, make_workload

SCENARIOS = ("sweep", "prefill-interference", "prefix-reuse", *LOAD_SCENARIOS)
EXIT_PREFLIGHT, EXIT_USAGE, EXIT_SERVER_FAILED, EXIT_INTERRUPTED = 1, 2, 3, 130
LONG_PROMPT_SCENARIOS = ("prefill-interference", "prefix-reuse")
AUTO = "auto"
AUTO_DEFAULTS = Budget()  # --budget-points, --budget-seconds, --max-concurrency, --auto-start


class UsageError(ValueError):
    pass


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"concurrency levels must be integers >= 1, got {text!r}")
    return tuple(sorted(set(vals)))


def _levels(text: str) -> tuple[int, ...] | str:
    """`auto` (the adaptive search) or a comma-separated list of levels."""
    return AUTO if text.strip().lower() == AUTO else _int_list(text)


def _float_list(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not (v > 0) for v in vals):
        raise argparse.ArgumentTypeError(f"floors must be positive tok/s values, got {text!r}")
    return tuple(sorted(set(vals)))


def positive(kind):
    """An argparse type: a positive `kind` (int or float), or one line saying what was expected."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return v
    return parse


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], e.g. 0.99, got {text!r}")
    return v


AUTO_FLAGS = ("budget_points", "budget_seconds", "max_concurrency", "auto_start")


def search_config(args) -> SearchConfig | None:
    """The adaptive search of --levels auto (None for a fixed ladder).  Raises UsageError for a
    budget that cannot work or a search flag without --levels auto."""
    given = [f"--{name.replace('_', '-')}" for name in AUTO_FLAGS if getattr(args, name, None) is not None]
    if args.levels != AUTO:
        if given:
            raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --levels auto only")
        return None
    d = AUTO_DEFAULTS
    budget = Budget(max_points=args.budget_points or d.max_points,
                    max_seconds=args.budget_seconds or d.max_seconds,
                    max_concurrency=args.max_concurrency or d.max_concurrency, start=args.auto_start or d.start)
    slo = latency_slo(args)
    try:
        return SearchConfig.make(args.floor, slo_target=None if slo is None else slo.target, budget=budget)
    except BudgetError as exc:
        raise UsageError(str(exc)) from None


def _search_json(cfg: SearchConfig) -> dict:
    b = cfg.budget
    return {"budget_points": b.max_points, "budget_seconds": b.max_seconds, "max_concurrency": b.max_concurrency,
            "start": b.start, "boundaries": [x.label for x in cfg.boundaries]}


def latency_slo(args) -> LatencySLO | None:
    """The --slo-* options as a LatencySLO; None when none of the bounds is given."""
    if args.slo_ttft is None and args.slo_floor is None and args.slo_e2e is None:
        return None
    return LatencySLO(ttft_seconds=args.slo_ttft, floor_tokens_per_second=args.slo_floor,
                      e2e_seconds=args.slo_e2e, target=args.slo_target)


def run_async(coro, loop: str = "auto"):
    """asyncio.run on uvloop when available (`auto`) or asked for: about half the client CPU per
    streamed token (benchmarks/client_overhead.py); plain asyncio otherwise.  Ctrl-C cancels the
    main task either way."""
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise UsageError("--event-loop uvloop: uvloop is not installed (pip install uvloop)") from None
        else:
            if sys.version_info >= (3, 11):
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    return runner.run(coro)
            uvloop.install()
    return asyncio.run(coro)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    t = parser.add_argument_group("target")
    t.add_argument("--endpoint", action="append", metavar="URL",
                   help="OpenAI-compatible server root (http://host:8000); repeat for a fleet "
                        "(default http://127.0.0.1:8000)")
    t.add_argument("--model", action="append", metavar="NAME",
                   help="served model name; once for all endpoints or once per endpoint "
                        "(default: the first model each endpoint serves)")
    t.add_argument("--label", action="append", metavar="NAME",
                   help="curve label per endpoint (default: the model name, plus host:port for a fleet)")
    t.add_argument("--api", choices=("chat", "completions"), default="chat",
                   help="chat: /v1/chat/completions; completions: /v1/completions (random prompts are exact "
                        "token-id lists there) (default: %(default)s)")
    t.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (default: $OPENAI_API_KEY)")

    w = parser.add_argument_group("load")
    w.add_argument("--mode", choices=("waves", "closed-loop"), default="waves",
                   help="waves: synchronized waves of N streams (seed 003); closed-loop: keep N in flight "
                        "(default: %(default)s)")
    w.add_argument("--levels", type=_levels, default=DEFAULT_LEVELS, metavar="N,N,...|auto",
                   help="concurrency levels (default: 1,2,4,8,16,32,64), or auto: grow from 1 until the knee "
                        "and every capacity boundary are bracketed, then bisect each to one stream")
    w.add_argument("--trials", type=positive(int), default=3, help="measured trials per level (seed: 1-5; default: %(default)s)")
    w.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up wave per level")
    w.add_argument("--requests", type=positive(int), default=None,
                   help="closed loop: requests per trial (default 4 x concurrency)")
    w.add_argument("--duration", type=positive(float), default=None,
                   help="closed loop: seconds per trial (new requests stop after it; in-flight ones finish)")
    w.add_argument("--workload", default="code,prose", metavar="W[,W]",
                   help=f"workloads, comma-separated, from {', '.join(WORKLOAD_NAMES)} (default: %(default)s)")
    w.add_argument("--output-tokens", type=positive(int), default=None,
                   help="requested output tokens for every workload (default: code 1000, prose 500, random 256)")
    w.add_argument("--temperature", type=float, default=None,
                   help="temperature for every workload (default: code 0, prose 0.7, random 0)")
    w.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="tokenizer folder of the served model: random prompts become exact-length text, "
                        "as `vllm bench serve --dataset-name random` sends (needs transformers)")
    w.add_argument("--random-input-len", type=positive(int), default=256,
                   help="prompt tokens of the random workload (default: %(default)s)")
    w.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos (outputs may then end short; they are flagged)")
    w.add_argument("--include-short", action="store_true",
                   help="include streams that ended short in the per-stream rate statistics")
    w.add_argument("--no-unique-prompts", dest="unique_prompts", action="store_false",
                   help="send the prompt sets verbatim (later waves may hit the prefix cache)")
    w.add_argument("--thinking", action="store_true",
                   help="chat API: leave reasoning on (default sends chat_template_kwargs enable_thinking=false)")
    w.add_argument("--seed", type=int, default=None, help="seed for random prompts")

    au = parser.add_argument_group("adaptive search (--levels auto; budgets are per curve)")
    au.add_argument("--budget-points", type=positive(int), default=None, metavar="N",
                    help=f"most levels to measure (default: {AUTO_DEFAULTS.max_points})")
    au.add_argument("--budget-seconds", type=positive(float), default=None, metavar="S",
                    help="most wall time, warm-ups included; a point that would pass it is not started "
                         f"(default: {AUTO_DEFAULTS.max_seconds:g})")
    au.add_argument("--max-concurrency", type=positive(int), default=None, metavar="N",
                    help=f"highest level the search may ask for (default: {AUTO_DEFAULTS.max_concurrency})")
    au.add_argument("--auto-start", type=positive(int), default=None, metavar="N",
                    help=f"first level (default: {AUTO_DEFAULTS.start})")

    a = parser.add_argument_group("analysis")
    a.add_argument("--floor", type=_float_list, default=(20.0,), metavar="TPS[,TPS]",
                   help="per-stream decode-rate floors for capacity, tok/s (default: 20, seed 003)")
    a.add_argument("--ttft-slo", type=positive(float), default=None, metavar="SECONDS",
                   help="also bound the fitted capacity by median TTFT (knee fit only)")

    slo = parser.add_argument_group("latency SLO (goodput and attainment per point; any one turns it on)")
    slo.add_argument("--slo-ttft", type=positive(float), default=None, metavar="SECONDS",
                     help="a request meets the SLO only if its TTFT is at most this")
    slo.add_argument("--slo-floor", type=positive(float), default=None, metavar="TPS",
                     help="... and its per-stream decode rate is at least this (requests with < 2 tokens: TTFT alone)")
    slo.add_argument("--slo-e2e", type=positive(float), default=None, metavar="SECONDS",
                     help="... and its end-to-end time (request sent to last token) is at most this")
    slo.add_argument("--slo-target", type=_fraction, default=0.99, metavar="FRACTION",
                     help="attainment a concurrency must reach to count as meeting the SLO (default: %(default)s)")

    s = parser.add_argument_group("scenarios (seed 003)")
    s.add_argument("--scenario", action="append", choices=SCENARIOS,
                   help="what to run (repeatable; default: sweep)")
    s.add_argument("--scenario-streams", type=positive(int), default=8,
                   help="prefill-interference: decode streams running when the long prompt arrives "
                        "(default: %(default)s)")
    s.add_argument("--scenario-workload", choices=("code", "prose"), default="prose",
                   help="prefill-interference: prompts of the decode streams (default: %(default)s)")
    s.add_argument("--long-prompt-tokens", type=positive(int), default=32000,
                   help="long prompt / document length in tokens, shortened to fit max_model_len "
                        "(default: %(default)s)")
    s.add_argument("--probe-interval", type=positive(float), default=0.5,
                   help="prefill-interference: seconds between short probe requests during the prefill "
                        "(default: %(default)s)")
    s.add_argument("--baseline-seconds", type=positive(float), default=3.0,
                   help="prefill-interference: decode seconds measured before the long prompt "
                        "(default: %(default)s)")
    s.add_argument("--tail-seconds", type=positive(float), default=3.0,
                   help="prefill-interference: decode seconds kept after the long prompt (default: %(default)s)")
    s.add_argument("--overload-factor", type=positive(float), default=3.0,
                   help="overload, shift: closed-loop streams as a multiple of the server's live capacity at "
                        "--slo-floor (default: %(default)s)")
    s.add_argument("--overload-streams", type=positive(int), default=None,
                   help="overload, shift: this many closed-loop streams instead of factor x live capacity")
    s.add_argument("--overload-requests", type=positive(int), default=None,
                   help="overload, shift, poisson: requests in all (default: three per closed-loop stream; "
                        "poisson: three per stream of factor x capacity, or 60 with --poisson-rate)")
    s.add_argument("--poisson-factor", type=positive(float), default=1.5,
                   help="poisson: arrival rate as a multiple of the capacity's request rate, capacity x "
                        "--slo-floor / output tokens (default: %(default)s)")
    s.add_argument("--poisson-rate", type=positive(float), default=None, metavar="REQ_PER_S",
                   help="poisson: this arrival rate (requests/s) instead of factor x the capacity's")
    s.add_argument("--shift-after-requests", type=positive(int), default=None, metavar="N",
                   help="shift: requests issued after the first N change shape (default: half of them)")
    s.add_argument("--shift-after-seconds", type=positive(float), default=None, metavar="S",
                   help="shift: requests issued S seconds or more into the run change shape")
    s.add_argument("--shift-output-factor", type=positive(int), default=4,
                   help="shift: output tokens multiply by this (default: %(default)s)")
    s.add_argument("--shift-prompt-factor", type=positive(int), default=8,
                   help="shift: prompt tokens (--random-input-len) multiply by this (default: %(default)s)")
    s.add_argument("--dip-threshold", type=positive(float), default=0.5,
                   help="prefill-interference: the dip is where the rate is below this fraction of the "
                        "baseline (default: %(default)s)")
    s.add_argument("--reuse-repeats", type=positive(int), default=3,
                   help="prefix-reuse: documents, each sent twice: cold, then cached (default: %(default)s)")

    o = parser.add_argument_group("timeouts and output")
    o.add_argument("--connect-timeout", type=positive(float), default=5.0,
                   help="seconds for preflight and TCP connects (default: %(default)s)")
    o.add_argument("--read-timeout", type=positive(float), default=120.0,
                   help="longest silence (s) allowed within a request (default: %(default)s)")
    o.add_argument("--request-timeout", type=positive(float), default=3600.0, help="seconds per request (default: %(default)s)")
    o.add_argument("--out", type=Path, default=None,
                   help="output folder (default runs/bench-YYYYmmdd-HHMMSS)")
    o.add_argument("--quiet", action="store_true", help="no progress output")
    o.add_argument("--event-loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                   help="client event loop (default auto: uvloop when installed)")


def _targets_spec(args) -> list[tuple[str, str | None, str | None]]:
    endpoints = [normalize_endpoint(e) for e in (args.endpoint or ["http://127.0.0.1:8000"])]
    models = args.model or []
    if len(models) not in (0, 1, len(endpoints)):
        raise UsageError(f"--model given {len(models)} times for {len(endpoints)} endpoints: give it once "
                         f"(all endpoints) or once per endpoint")
    labels = args.label or []
    if labels and len(labels) != len(endpoints):
        raise UsageError(f"--label given {len(labels)} times for {len(endpoints)} endpoints")
    if len(set(endpoints)) != len(endpoints):
        raise UsageError("the same --endpoint is given twice")
    out = []
    for i, e in enumerate(endpoints):
        model = models[i] if len(models) == len(endpoints) else (models[0] if models else None)
        out.append((e, model, labels[i] if labels else None))
    return out


def _workloads(args) -> list[Workload]:
    names = [n.strip() for n in args.workload.split(",") if n.strip()]
    if not names:
        raise UsageError("--workload is empty")
    try:
        return [make_workload(n, output_tokens=args.output_tokens, temperature=args.temperature,
                              input_tokens=args.random_input_len) for n in dict.fromkeys(names)]
    except ValueError as exc:
        raise UsageError(f"--workload: {exc}") from None


def _config_dict(args, workloads: list[Workload], scenarios: list[str]) -> dict:
    return {"mode": args.mode, "levels": args.levels if args.levels == AUTO else list(args.levels),
            "search": None if args.levels != AUTO else _search_json(search_config(args)),
            "trials": args.trials, "warmup": args.warmup,
            "requests": args.requests, "duration": args.duration,
            "workloads": [w.describe() for w in workloads], "api": args.api, "ignore_eos": args.ignore_eos,
            "include_short": args.include_short, "unique_prompts": args.unique_prompts,
            "thinking": args.thinking, "tokenizer": args.tokenizer, "floors": list(args.floor),
            "ttft_slo": args.ttft_slo,
            "slo": None if latency_slo(args) is None else {
                "ttft_seconds": args.slo_ttft, "floor_tokens_per_second": args.slo_floor,
                "e2e_seconds": args.slo_e2e, "target_attainment": args.slo_target},
            "scenarios": scenarios, "timeouts": {"connect": args.connect_timeout, "read": args.read_timeout,
                                                 "request": args.request_timeout}}


async def _prepare(args, specs, need_token_pool: bool, run_id: str) -> list[EndpointTarget]:
    infos: list[ServerInfo] = await asyncio.gather(
        *(preflight(e, m, timeout=args.connect_timeout, api_key=args.api_key) for e, m, _ in specs))
    targets = []
    many = len(specs) > 1
    for (endpoint, _, label), info in zip(specs, infos):
        await collect(info, timeout=args.connect_timeout, api_key=args.api_key)
        prompts = PromptFactory(run_id, unique=args.unique_prompts, seed=args.seed)
        if args.tokenizer:
            try:
                prompts.use_tokenizer(args.tokenizer)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        elif need_token_pool:
            # Exact-length random prompts: token ids of ordinary tokens for the completions API, and
            # the model's tokens-per-word ratio for random-word text (chat API).
            ids = await tokenize(info.endpoint, info.model, prompts.corpus(), api_key=args.api_key)
            info.tokenize_available = ids is not None
            if ids:
                prompts.token_pool = sorted(set(ids))
                sample = prompts.random_prompt(400, token_ids=False)
                n = await tokenize(info.endpoint, info.model, sample, api_key=args.api_key)
                if n:
                    prompts.tokens_per_word = len(n) / len(sample.split())
        if label is None:
            label = f"{info.model}@{info.endpoint.split('://', 1)[-1]}" if many else info.model
        targets.append(EndpointTarget(info=info, label=label, prompts=prompts,
                                      client_kwargs={"api": args.api, "ignore_eos": args.ignore_eos,
                                                     "disable_thinking": not args.thinking,
                                                     "timeouts": Timeouts(args.connect_timeout, args.read_timeout,
                                                                          args.request_timeout)}))
    return targets


async def _run_all(args, targets, workloads, scenarios, record: RunRecord, runner: SweepRunner) -> None:
    if "sweep" in scenarios:
        for target in targets:
            await runner.run_target(target, workloads)
    for target in targets:
        info = target.info
        suffix = f" ({target.label})" if len(targets) > 1 else ""
        async with OpenAIStreamClient(info.endpoint, info.model, api_key=args.api_key,
                                      # load scenarios: no client-side queue (open loop may hold many)
                                      max_connections=0 if any(s in LOAD_SCENARIOS for s in scenarios)
                                      else args.scenario_streams + 64, **target.client_kwargs) as client:
            if "prefill-interference" in scenarios:
                runner.progress.note(f"scenario prefill-interference{suffix}: {args.scenario_streams} decode streams, "
                                     f"one {args.long_prompt_tokens}-token prompt")
                cfg = S.InterferenceConfig(streams=args.scenario_streams, long_prompt_tokens=args.long_prompt_tokens,
                                           baseline_seconds=args.baseline_seconds, tail_seconds=args.tail_seconds,
                                           probe_interval=args.probe_interval, threshold=args.dip_threshold,
                                           timeout=args.request_timeout)
                wl = make_workload(args.scenario_workload, output_tokens=args.output_tokens, temperature=args.temperature)
                res = await S.prefill_interference(client, target.prompts, wl, cfg, info.max_model_len,
                                                   S.server_token_counter(info, args.api_key))
                record.scenarios["prefill-interference" + suffix] = res
            for name in (s for s in LOAD_SCENARIOS if s in scenarios):
                cfg = load_config(args, name)
                runner.progress.note(f"scenario {name}{suffix}: " + _load_words(cfg))
                res = await run_load(client, target.prompts, workloads[0], cfg,
                                     lambda: metrics_text(info.endpoint, api_key=args.api_key))
                record.scenarios[name + suffix] = res
                runner.progress.note(overload_line(res))
            if "prefix-reuse" in scenarios:
                runner.progress.note(f"scenario prefix-reuse{suffix}: {args.reuse_repeats} document(s) of "
                                     f"{args.long_prompt_tokens} tokens, each sent twice")
                res = await S.prefix_reuse(client, target.prompts, args.long_prompt_tokens, args.reuse_repeats,
                                           info.max_model_len, S.server_token_counter(info, args.api_key))
                record.scenarios["prefix-reuse" + suffix] = res


def load_config(args, name: str) -> LoadConfig:
    """The load scenario `name` as the command line gives it."""
    poisson = name == "poisson"
    return LoadConfig(scenario=name, floor=args.slo_floor, ttft_slo=args.slo_ttft,
                      factor=args.poisson_factor if poisson else args.overload_factor,
                      streams=None if poisson else args.overload_streams,
                      arrival_rate=args.poisson_rate if poisson else None, requests=args.overload_requests,
                      shift_after_requests=args.shift_after_requests, shift_after_seconds=args.shift_after_seconds,
                      output_factor=args.shift_output_factor, prompt_factor=args.shift_prompt_factor, seed=args.seed)


def _load_words(cfg: LoadConfig) -> str:
    if cfg.scenario == "poisson":
        return (f"Poisson arrivals at {cfg.arrival_rate:g} req/s" if cfg.arrival_rate else
                f"Poisson arrivals at {cfg.factor:g} x the capacity's request rate at {cfg.floor:g} tok/s")
    load = (f"{cfg.streams} streams" if cfg.streams else
            f"{cfg.factor:g} x the live capacity at {cfg.floor:g} tok/s")
    if cfg.scenario == "shift":
        when = (f"after {cfg.shift_after_seconds:g} s" if cfg.shift_after_seconds else
                f"after {cfg.shift_after_requests} requests" if cfg.shift_after_requests else "half way")
        load += f", output x{cfg.output_factor} and prompt x{cfg.prompt_factor} {when}"
    return load


def _check_context(args, targets: list[EndpointTarget], workloads: list[Workload], scenarios: list[str]) -> None:
    """Refuse, before any request, a run whose requests cannot fit a server's max_model_len (the long
    prompt scenarios shorten their prompt instead, and refuse only a window too small for one)."""
    token_ids = args.api == "completions"
    for t in targets:
        try:
            for w in (workloads if "sweep" in scenarios else []):
                t.prompts.check_fits(w, token_ids, t.info.max_model_len)
            if "shift" in scenarios:  # the longer requests after the shift must fit too
                t.prompts.check_fits(shifted_workload(workloads[0], args.shift_output_factor,
                                                      args.shift_prompt_factor), token_ids, t.info.max_model_len)
            if any(s in LONG_PROMPT_SCENARIOS for s in scenarios):
                S.fit_prompt_len(args.long_prompt_tokens, t.info.max_model_len, exact=False)  # the stricter fit
        except ContextError as exc:
            raise UsageError(f"{t.info.endpoint} (model {t.info.model}): {exc}") from None


def _check_load_options(args, scenarios: list[str], workloads: list[Workload]) -> None:
    load = [s for s in LOAD_SCENARIOS if s in scenarios]
    if load and args.slo_floor is None:
        raise UsageError(f"--scenario {load[0]} judges requests by the per-stream floor: give --slo-floor F "
                         "(tok/s; one of the server's SPARK_PLUGIN_FLOORS to load it at its live capacity)")
    if "poisson" in scenarios and args.slo_ttft is None:
        raise UsageError("--scenario poisson queues requests as they arrive: judge their wait with --slo-ttft S "
                         "(seconds; the server's SPARK_PLUGIN_TTFT_SLO_SECONDS to compare with its counters)")
    if "shift" in scenarios:
        if workloads[0].name != "random":
            raise UsageError("--scenario shift multiplies the prompt length: use --workload random "
                             "(--random-input-len sets the length before the shift)")
        if args.shift_after_requests and args.shift_after_seconds:
            raise UsageError("shift: give --shift-after-requests or --shift-after-seconds, not both")


def run(args, reference: dict | None = None) -> int:
    """The command.  `reference`: a predicted curve to draw beside the measured one (`vllm-spark
    check` hands the planner's; keys label, concurrency, per_stream, aggregate)."""
    err = sys.stderr
    scenarios = list(dict.fromkeys(args.scenario or ["sweep"]))
    try:
        specs = _targets_spec(args)
        workloads = _workloads(args)
        if args.mode == "closed-loop" and args.requests and args.duration:
            raise UsageError("closed loop: give --requests or --duration, not both")
        if args.mode == "waves" and (args.requests or args.duration):
            raise UsageError("--requests / --duration apply to --mode closed-loop only")
        search = search_config(args)
        _check_load_options(args, scenarios, workloads)
        if search is not None and "sweep" not in scenarios:
            raise UsageError("--levels auto chooses the sweep's levels: add --scenario sweep or drop --levels auto")
    except UsageError as exc:
        print(f"vllm-spark bench: error: {exc}", file=err)
        return EXIT_USAGE

    run_id = datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    need_pool = "random" in [w.name for w in workloads] or any(s != "sweep" for s in scenarios)
    try:
        targets = run_async(_prepare(args, specs, need_pool, run_id), args.event_loop)
        _check_context(args, targets, workloads, scenarios)
    except PreflightError as exc:
        print(f"vllm-spark bench: error: {exc}", file=err)
        return EXIT_PREFLIGHT
    except UsageError as exc:
        print(f"vllm-spark bench: error: {exc}", file=err)
        return EXIT_USAGE

    cfg = SweepConfig(levels=() if search else args.levels, trials=args.trials, warmup=args.warmup, mode=args.mode,
                      requests=args.requests, duration=args.duration, include_short=args.include_short,
                      api_key=args.api_key, slo=latency_slo(args), search=search)
    out = Path(args.out or Path("runs") / f"bench-{run_id[:15]}")
    out.mkdir(parents=True, exist_ok=True)
    config = _config_dict(args, workloads, scenarios)
    config["request_count_per_trial"] = _request_counts(args, cfg, () if search else args.levels)
    record = RunRecord(run_id=run_id, started=now_iso(), config=config, out_dir=out,
                       servers=[t.info.to_json() | {"label": t.label} for t in targets])
    _write_meta(record, workloads)
    units = cfg.units(len(targets) * len(workloads)) if "sweep" in scenarios else 0
    progress = Progress(units, enabled=not args.quiet)
    csv_writer = CsvWriter(out / CSV_NAME)
    streams_writer = CsvWriter(out / STREAMS_NAME, STREAM_COLUMNS)
    runner = SweepRunner(cfg, record, csv_writer, progress, streams_writer)
    if not args.quiet:
        for t in targets:
            print(f"vllm-spark bench: {t.label}: {t.info.endpoint} model {t.info.model} "
                  f"(engine {t.info.engine_version or 'unknown'}, max_model_len {t.info.max_model_len or 'unknown'})",
                  file=err)
    code = 0
    try:
        run_async(_run_all(args, targets, workloads, scenarios, record, runner), args.event_loop)
        record.status, record.message = "complete", "all points completed"
    except KeyboardInterrupt:
        record.status = "interrupted"
        record.message = f"interrupted by the user after {len(record.points)} completed point(s)"
        code = EXIT_INTERRUPTED
    except ServerGone as exc:
        record.status = "failed"
        record.message = f"{exc}; {len(record.points)} completed point(s) kept"
        code = EXIT_SERVER_FAILED
    except S.ScenarioError as exc:
        record.status = "failed"
        record.message = str(exc)
        code = EXIT_SERVER_FAILED
    finally:
        progress.close()
        csv_writer.close()
        streams_writer.close()
        record.finished = now_iso()
        if record.status == "running":  # an unexpected exception is on its way out
            record.status, record.message = "failed", "internal error (see the traceback)"
        if search is not None:  # the levels the search chose
            record.config["request_count_per_trial"] = _request_counts(
                args, cfg, sorted({p.concurrency for p in record.points}))
        summary = _finish(record, args, workloads, reference)
    if code:
        print(f"vllm-spark bench: error: {record.message}. Partial results in {out}/ "
              f"({CSV_NAME}, summary.json, report.html)", file=err)
    for line in summary["capacity_statements"]:
        print(line)
    print(f"results: {out}/ ({', '.join(sorted(set(summary['files'].values())))})")
    return code


def _request_counts(args, cfg: SweepConfig, levels) -> dict[str, int | None]:
    return {str(c): c if args.mode == "waves" else cfg.requests_for(c) for c in levels}


def _write_meta(record: RunRecord, workloads: list[Workload]) -> None:
    write_json(record.out_dir / META_NAME, {
        "run_id": record.run_id, "tool": "vllm-spark bench", "plugin_version": __version__,
        "started": record.started, "finished": record.finished, "status": record.status,
        "command": ["vllm-spark", *sys.argv[1:]] if sys.argv[1:2] == ["bench"] else None,
        "config": record.config, "servers": record.servers,
        "workloads": [{"name": w.name, "output_tokens": w.output_tokens, "temperature": w.temperature,
                       "input_tokens": w.input_tokens} for w in workloads],
        "request_count_per_trial": record.config["request_count_per_trial"],
        "csv_columns": CSV_COLUMNS,
        "streams_csv_columns": STREAM_COLUMNS,
    })


def _finish(record: RunRecord, args, workloads, reference: dict | None = None) -> dict:
    from .report import write_reports
    _write_meta(record, workloads)
    return write_reports(record, tuple(args.floor), args.ttft_slo, latency_slo(args), reference)
