"""The `vllm-spark doctor` command: its arguments, the report (text or JSON) and the exit code.

    vllm-spark doctor [--json] [--model PATH] [--sm X.Y] [--endpoint URL [--rules FILE_OR_DIR]]
                      [-- <the vllm serve arguments you plan to use>]
    vllm-spark doctor --link-serve [[ADDR:]PORT]      on one host, then on another:
    vllm-spark doctor --link-probe HOST[:PORT] [--link-seconds S] [--link-bytes SIZE] [--link-streams N]

Exit code 0 when no check fails (warnings allowed), 1 when a check fails, 2 on bad arguments; the
link probe exits 1 when the peer cannot be measured (unreachable, refused, stalled).
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

from vllm_spark_plugin.doctor import registry
from vllm_spark_plugin.doctor.check import FAIL, INFO, NA, OK, WARN, Check
from vllm_spark_plugin.doctor.probe import Probe
from vllm_spark_plugin.doctor.serve_args import parse_serve_args


def format_checks(checks: list[Check]) -> str:
    tag = {OK: " OK ", INFO: "INFO", WARN: "WARN", FAIL: "FAIL", NA: " n/a"}
    lines = []
    for c in checks:
        lines.append(f"[{tag[c.status]}] {c.name}: {c.detail}")
        if c.fix:
            lines.append(f"       fix: {c.fix}")
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    na = sum(c.status == NA for c in checks)
    lines.append(f"{failed} failed, {warned} warning(s)" + (f", {na} not applicable" if na else ""))
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--model", help="model folder (for the memory check: its weight size)")
    parser.add_argument("--gpu-memory-utilization", type=float, dest="gpu_memory_utilization",
                        help="the value you plan to serve with (default: read from the serve arguments, "
                             "else vLLM's default 0.9 on CUDA)")
    parser.add_argument("--sm", help="the compute capability to check vLLM's FP4 kernels against instead of this "
                                     "machine's device (e.g. 12.1 for a GB10: check a build before deploying it)")
    parser.add_argument("--endpoint", metavar="URL",
                        help="a running server (http://HOST:PORT): compare the floors its /metrics exports with "
                             "the floors the Prometheus rules select")
    parser.add_argument("--rules", action="append", default=[], metavar="FILE_OR_DIR",
                        help="the Prometheus rules to compare with --endpoint (repeatable; default: the deploy's, "
                             "alerts/ or /etc/vllm-spark/prometheus/rules)")
    from vllm_spark_plugin.doctor import link_probe
    link_probe.add_arguments(parser)
    parser.add_argument("serve_args", nargs="*", metavar="-- VLLM_SERVE_ARGS",
                        help="after --: the vllm serve arguments you plan to use (e.g. -- serve MODEL "
                             "--gpu-memory-utilization 0.7 --enforce-eager)")


def run(args) -> int:
    if getattr(args, "link_probe", None) or getattr(args, "link_serve", None):
        from vllm_spark_plugin.doctor import link_probe
        return link_probe.run(args)
    try:
        serve = parse_serve_args(list(args.serve_args or []))
    except ValueError as exc:
        print(f"vllm-spark doctor: error: {exc}", file=sys.stderr)
        return 2
    if args.model:
        serve.model = args.model
    if args.gpu_memory_utilization is not None:
        serve.gpu_memory_utilization = args.gpu_memory_utilization
    probe = None
    if getattr(args, "sm", None):
        from vllm_spark_plugin.doctor import kernels as doctor_kernels
        try:
            probe = Probe(extra={"sm": doctor_kernels.parse_sm(args.sm)})
        except ValueError as exc:
            print(f"vllm-spark doctor: error: {exc}", file=sys.stderr)
            return 2
    checks = registry.run_checks(serve=serve, probe=probe, endpoint=getattr(args, "endpoint", None),
                                 rules=getattr(args, "rules", None) or ())
    failed = any(c.status == FAIL for c in checks)
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(format_checks(checks))
    return 1 if failed else 0
