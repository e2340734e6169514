"""`vllm-spark plan`: memory fit, decode curve, knee, capacity and TTFT from model and hardware specs."""
from __future__ import annotations

import argparse
import json
import sys

from vllm_spark_plugin.definitions import DEFAULT_FLOOR_TOKENS_PER_SECOND
from vllm_spark_plugin.plan.arch import ConfigError, builtin_models
from vllm_spark_plugin.plan.deployment import GiB, Deployment, PlanError, default_compute_dtype
from vllm_spark_plugin.plan.engine import ENGINES, LINEAR_BACKENDS, MOE_BACKENDS
from vllm_spark_plugin.plan.formats import (KV_DTYPE_BYTES, SCOPES, STATE_DTYPE_BYTES, WEIGHT_FORMAT_BITS,
                                            component_formats)
from vllm_spark_plugin.plan.hardware import HardwareError, builtin_profiles, load_hardware
from vllm_spark_plugin.plan.links import LinkRateError
from vllm_spark_plugin.plan.planner import DEFAULT_CONCURRENCY

PROG = "vllm-spark plan"


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _fraction(text: str) -> float:
    v = _positive_float(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def _int_list(text: str) -> list[int]:
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not vals or vals[0] < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return vals


def _component_format(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected COMPONENT=FORMAT (e.g. lm_head=fp8), got {text!r}")
    comp, fmt = (x.strip() for x in text.split("=", 1))
    return comp, fmt


def _link_rate(text: str):
    from vllm_spark_plugin.plan.links import given

    try:
        return given(text)
    except LinkRateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("what to plan")
    g.add_argument("--model", "-m", help="built-in model name or a path to config.json / a checkpoint folder "
                   f"(built-in: {', '.join(builtin_models())})")
    g.add_argument("--hardware", default="gb10", help="built-in profile (gb10, h100, h200) or a JSON profile file")
    g.add_argument("--weight-format", default="nvfp4", choices=sorted(WEIGHT_FORMAT_BITS),
                   help="storage format of the quantized components (default nvfp4)")
    g.add_argument("--quant-scope", choices=sorted(SCOPES), default=None,
                   help="components the weight format covers: 'linear' (all block linears, ModelOpt default) or "
                        "'experts' (routed experts only; default for mxfp4)")
    g.add_argument("--component-format", action="append", type=_component_format, default=[], metavar="COMP=FMT",
                   help="override one component's format (attention, linear_attention, dense_mlp, shared_experts, "
                        "routed_experts, moe_latent, router, embeddings, lm_head); repeatable")
    g.add_argument("--kv-dtype", default="auto", choices=["auto"] + sorted(KV_DTYPE_BYTES),
                   help="KV-cache dtype (auto: the checkpoint's, else bf16)")
    g.add_argument("--state-dtype", default="auto", choices=["auto"] + sorted(STATE_DTYPE_BYTES),
                   help="linear-attention / Mamba recurrent-state dtype (auto: the config's mamba_ssm_dtype, else bf16)")
    g.add_argument("--compute-dtype", default=None, help="GEMM dtype for the FLOP peak (default: the weight format's)")
    g.add_argument("--text-only", action="store_true", help="do not count a vision encoder (vLLM --language-model-only)")
    w = parser.add_argument_group("workload")
    w.add_argument("--context", type=_positive_int, default=4096,
                   help="tokens of context each stream holds: sizes the KV cache and the KV read per decode step (default 4096)")
    w.add_argument("--prompt-tokens", type=_positive_int, default=None,
                   help="prompt length for TTFT (default min(1024, context))")
    w.add_argument("--floor", type=_positive_float, default=DEFAULT_FLOOR_TOKENS_PER_SECOND,
                   help="per-stream decode floor for capacity, tok/s (default 20, seed 003)")
    w.add_argument("--concurrency", type=_int_list, default=list(DEFAULT_CONCURRENCY),
                   help="concurrency points of the curve (default 1,2,4,...,256)")
    p = parser.add_argument_group("parallelism and engine")
    p.add_argument("--sparks", type=_positive_int, default=None, help="nodes in total (default tp*pp*dp)")
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel size (nodes per replica)")
    p.add_argument("--pp", type=_positive_int, default=1, help="pipeline-parallel size")
    p.add_argument("--dp", type=_positive_int, default=None, help="data-parallel replicas (default sparks/(tp*pp))")
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=None,
                   help="vLLM's memory fraction (default: the profile's, 0.85 on gb10)")
    p.add_argument("--os-reserve-gib", type=_nonneg_float, default=None,
                   help="memory kept for the OS on unified-memory boxes (default: the profile's, 8 GiB on gb10)")
    p.add_argument("--cudagraph-gib", type=_nonneg_float, default=1.0, help="CUDA-graph memory (default 1 GiB)")
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192)
    p.add_argument("--max-num-seqs", type=_positive_int, default=256)
    p.add_argument("--link-rate", type=_link_rate, default=None, metavar="RATE",
                   help="measured rate of the slowest link, bytes/s or with a unit (12.5Gbit, 1.5GB/s), instead of "
                        "the profile's interconnect; the fleet section says what it costs (tp/pp only)")
    p.add_argument("--link-rate-from", default=None, metavar="URL|FILE",
                   help="read the link rate from the plugin's /metrics (the slowest negotiated "
                        "vllm_spark_link_rate_bytes_per_second) or a `vllm-spark doctor --link-probe HOST --json` "
                        "report (the achieved rate); with --link-rate, the slower of the two")
    s = parser.add_argument_group("serving (sources in docs/plan.md, 'Serving options')")
    s.add_argument("--engine", default="vllm", choices=sorted(ENGINES),
                   help="serving engine: sets the per-step overhead (default vllm)")
    s.add_argument("--moe-backend", default="auto", choices=MOE_BACKENDS, help="MoE kernel path (vLLM --moe-backend)")
    s.add_argument("--linear-backend", default="auto", choices=LINEAR_BACKENDS,
                   help="dense linear kernel path (vLLM --linear-backend)")
    s.add_argument("--engine-release", default="",
                   help="engine release class for kernel-path efficiencies (e.g. vllm-0.17: unpatched NVFP4 paths on SM12.1)")
    s.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs: every kernel pays a host launch")
    s.add_argument("--expert-parallel", action="store_true",
                   help="experts spread over the tp ranks (all-to-all dispatch/combine instead of the MoE all-reduce)")
    s.add_argument("--spec-method", default="mtp", choices=["mtp", "draft"], help="speculative decoding method")
    s.add_argument("--spec-tokens", type=_positive_int, default=None, help="drafted tokens per step (turns speculation on)")
    s.add_argument("--spec-acceptance-length", type=_positive_float, default=None,
                   help="mean tokens emitted per step per stream, 1..N+1 (default 1 + sum of 0.85^i)")
    s.add_argument("--spec-draft-cost", type=_nonneg_float, default=None,
                   help="cost of one drafted token as a fraction of a target step (default for mtp: one layer + lm_head)")
    s.add_argument("--routing-skew", type=_nonneg_float, default=None,
                   help="MoE routing skew (0 uniform; default: the model's published routing statistic)")
    e = parser.add_argument_group("efficiency and calibration")
    e.add_argument("--bandwidth-efficiency", type=_positive_float, default=None,
                   help="fraction of nominal bandwidth achieved (default 0.85)")
    e.add_argument("--compute-efficiency", type=_positive_float, default=None,
                   help="fraction of peak FLOP/s achieved (default 0.5)")
    e.add_argument("--overhead-scale", type=_positive_float, default=None,
                   help="multiplier on the profile's fixed per-step overhead (default 1)")
    e.add_argument("--calibration", metavar="FILE", help="load efficiency factors saved by --save-calibration")
    e.add_argument("--calibrate", metavar="FILE", help="fit the factors to a measured sweep (read with "
                   "vllm_spark_plugin.knee.loaders.load_points); the sweep must be of this model and workload")
    e.add_argument("--calibrate-label", help="which curve of the sweep file to fit")
    e.add_argument("--calibrate-point", action="append", default=[], metavar="C:AGG",
                   help="a measured point, concurrency:aggregate tok/s (e.g. 64:557.471); repeatable")
    e.add_argument("--save-calibration", metavar="FILE", help="write the fitted factors as JSON")
    o = parser.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    o.add_argument("--plot", metavar="PNG", help="write aggregate and per-stream curves with knee and floor")
    o.add_argument("--list", action="store_true", help="list the built-in models and hardware profiles and exit")


def build_deployment(args) -> tuple[Deployment, dict]:
    from vllm_spark_plugin.plan.arch import load_model
    from vllm_spark_plugin.plan.links import combine

    if not args.model:
        raise PlanError("--model is required (a built-in name or a config.json path)")
    arch, doc = load_model(args.model)
    hw = load_hardware(args.hardware)
    link = combine(args.link_rate, args.link_rate_from)
    if link is not None:
        hw = hw.with_link_rate(link.bytes_per_second, link.source)
    ckpt = (doc.get("checkpoints") or {}).get(args.weight_format) or {}
    overrides = dict(ckpt.get("component_formats") or {})
    overrides.update(dict(args.component_format))
    try:
        formats = component_formats(args.weight_format, args.quant_scope, overrides)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    kv = args.kv_dtype if args.kv_dtype != "auto" else ckpt.get("kv_dtype", "bf16")
    state = args.state_dtype if args.state_dtype != "auto" else arch.state_dtype
    tp, pp = args.tp, args.pp
    dp = args.dp
    if args.sparks is not None:
        if args.sparks % (tp * pp):
            raise PlanError(f"--sparks {args.sparks} is not a multiple of tp*pp = {tp * pp}")
        if dp is not None and dp * tp * pp != args.sparks:
            raise PlanError(f"--sparks {args.sparks} != dp*tp*pp = {dp * tp * pp}")
        dp = args.sparks // (tp * pp)
    dp = dp or 1
    util = args.gpu_memory_utilization or hw.gpu_memory_utilization
    os_reserve = hw.os_reserve_bytes if args.os_reserve_gib is None else args.os_reserve_gib * GiB
    dep = Deployment(
        arch=arch, hw=hw, weight_format=args.weight_format, formats=formats, kv_dtype=kv, state_dtype=state,
        compute_dtype=args.compute_dtype or default_compute_dtype(args.weight_format),
        context=args.context, prompt_tokens=args.prompt_tokens or min(1024, args.context),
        tp=tp, pp=pp, dp=dp, gpu_memory_utilization=util, os_reserve_bytes=os_reserve,
        cudagraph_bytes=args.cudagraph_gib * GiB, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, text_only=args.text_only, serving=_serving(args),
        model_routing=doc.get("routing") or {})
    return dep, doc


def _serving(args):
    from vllm_spark_plugin.plan.engine import Serving, SpecDecode

    spec = None
    if args.spec_tokens:
        spec = SpecDecode(method=args.spec_method, num_tokens=args.spec_tokens,
                          acceptance_length=args.spec_acceptance_length, draft_cost=args.spec_draft_cost)
    elif args.spec_acceptance_length is not None or args.spec_draft_cost is not None:
        raise PlanError("--spec-acceptance-length / --spec-draft-cost need --spec-tokens N")
    return Serving(engine=args.engine, release=args.engine_release, moe_backend=args.moe_backend, linear_backend=args.linear_backend,
                   enforce_eager=args.enforce_eager, expert_parallel=args.expert_parallel, spec=spec,
                   routing_skew=args.routing_skew)


def _efficiency(args, dep):
    """Machine/engine factors and the model's own factors: from a calibration file, a fit, or by hand."""
    from vllm_spark_plugin.plan.calibrate import (calibrate_split, load_calibration, parse_point, points_from_file,
                                                  save_calibration)
    from vllm_spark_plugin.plan.stepmodel import Efficiency

    eff, model, cal, cal_file = Efficiency(), None, None, None
    if args.calibration:
        cal = load_calibration(args.calibration)
        eff, cal_file = cal.efficiency, args.calibration
        model = cal.factors_for(dep.arch.name)
        if cal.hardware and cal.hardware != dep.hw.name:
            print(f"{PROG}: warning: calibration {args.calibration} was fitted on {cal.hardware!r}, "
                  f"planning for {dep.hw.name!r}", file=sys.stderr)
        if cal.engine and cal.engine != dep.serving.engine:
            print(f"{PROG}: warning: calibration {args.calibration} was fitted with engine {cal.engine!r}, "
                  f"planning for {dep.serving.engine!r}", file=sys.stderr)
    points = [parse_point(t) for t in args.calibrate_point]
    if args.calibrate:
        _label, file_points = points_from_file(args.calibrate, args.calibrate_label)
        points += file_points
        cal_file = args.calibrate
    if points:
        cal = calibrate_split(dep, points, base=eff)
        eff, model = cal.efficiency, cal.model_factors
    if args.save_calibration:
        if cal is None:
            raise PlanError("--save-calibration needs --calibrate FILE or --calibrate-point")
        save_calibration(cal, args.save_calibration)
    if args.bandwidth_efficiency is not None or args.compute_efficiency is not None or args.overhead_scale is not None:
        eff = Efficiency(bandwidth=args.bandwidth_efficiency or eff.bandwidth,
                         compute=args.compute_efficiency or eff.compute,
                         overhead_scale=args.overhead_scale or eff.overhead_scale, link_scale=eff.link_scale,
                         source="command line" if eff.source == "defaults" else f"{eff.source} + command line")
    try:
        eff.validate()
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    return eff, model, cal, cal_file


def run(args) -> int:
    try:
        if args.list:
            print("models:   " + ", ".join(builtin_models()))
            print("hardware: " + ", ".join(builtin_profiles()))
            return 0
        from vllm_spark_plugin.plan.planner import make_plan
        from vllm_spark_plugin.plan.report import render_table, write_plot

        dep, doc = build_deployment(args)
        eff, model, cal, cal_file = _efficiency(args, dep)
        plan = make_plan(dep, eff, model_factors=model, floor=args.floor, concurrencies=args.concurrency, calibration=cal,
                         calibration_file=cal_file, model_doc=doc)
        if args.plot:
            try:
                write_plot(plan, args.plot)
            except OSError as exc:
                raise PlanError(f"cannot write plot {args.plot}: {exc.strerror or exc}") from None
        if args.json:
            print(json.dumps(plan, indent=2))
        else:
            sys.stdout.write(render_table(plan))
            if args.plot:
                print(f"plot written to {args.plot}")
        return 0
    except (PlanError, ConfigError, HardwareError, LinkRateError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
