"""`vllm-spark dashboards`: regenerate the Grafana dashboards and the Prometheus rules with your SLOs.

    vllm-spark dashboards                                # defaults: writes ./dashboards and ./alerts
    vllm-spark dashboards --ttft-slo 1 --floor 15 --out /etc/grafana/dashboards/vllm --alerts-out /etc/prometheus/rules
    vllm-spark dashboards --check                        # exit 1 if the files differ from a regeneration
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_spark_plugin.grafana.slo import DEFAULT_RUNBOOK_BASE, SLOConfig, SLOError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SLOConfig()
    parser.add_argument("--out", default="dashboards", metavar="DIR",
                        help="directory for the dashboard JSON (default: %(default)s)")
    parser.add_argument("--alerts-out", default="alerts", metavar="DIR",
                        help="directory for recording.rules.yml and alerting.rules.yml (default: %(default)s); "
                             "'-' skips the rules")
    parser.add_argument("--ttft-slo", type=float, default=d.ttft_slo_seconds, metavar="SECONDS",
                        help="TTFT SLO threshold, any positive number; serve with the same SPARK_PLUGIN_TTFT_SLO_SECONDS so "
                             "the TTFT histogram has that bound (default: %(default)g)")
    parser.add_argument("--floor", type=float, default=d.floor_tokens_per_second, metavar="TOK_S",
                        help="per-stream decode-rate floor, any positive number; serve with it among SPARK_PLUGIN_FLOORS so "
                             "the rate histogram has that bound (default: %(default)g)")
    parser.add_argument("--knee-warn", type=float, default=d.knee_warn, metavar="RATIO",
                        help="knee ratio shown amber and the 'approaching knee' alert (default: %(default)g)")
    parser.add_argument("--knee-crit", type=float, default=d.knee_crit, metavar="RATIO",
                        help="knee ratio shown red and the 'past knee' alert (default: %(default)g)")
    parser.add_argument("--ttft-slo-target", type=float, default=d.ttft_slo_target, metavar="FRACTION",
                        help="share of requests that must meet the TTFT SLO (default: %(default)g)")
    parser.add_argument("--rate-slo-target", type=float, default=d.rate_slo_target, metavar="FRACTION",
                        help="share of requests whose per-stream rate must exceed the floor (default: %(default)g)")
    parser.add_argument("--attainment-target", type=float, default=d.attainment_target, metavar="FRACTION",
                        help="share of requests that must meet TTFT SLO and floor together (default: %(default)g)")
    parser.add_argument("--min-requests", type=int, default=d.min_requests, metavar="N",
                        help="burn-rate alerts stay silent below N requests in their long window (default: %(default)d)")
    parser.add_argument("--link-share", type=float, default=d.link_share, metavar="FRACTION",
                        help="VllmSparkLinkBelowRate: a link carrying less than this share of its negotiated rate "
                             "while steps are slower than their baseline (default: %(default)g)")
    parser.add_argument("--job", default=d.job, help="Prometheus job name scraping vLLM (default: %(default)s)")
    parser.add_argument("--runbook-base-url", default=DEFAULT_RUNBOOK_BASE, metavar="URL",
                        help="prefix of each alert's runbook_url; the file name is ALERTNAME.md (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 and name the files that a regeneration would change")


def slo_from_args(args: argparse.Namespace) -> SLOConfig:
    return SLOConfig(ttft_slo_seconds=args.ttft_slo, floor_tokens_per_second=args.floor,
                     knee_warn=args.knee_warn, knee_crit=args.knee_crit,
                     ttft_slo_target=args.ttft_slo_target, rate_slo_target=args.rate_slo_target,
                     attainment_target=args.attainment_target,
                     min_requests=args.min_requests, job=args.job, link_share=args.link_share,
                     runbook_base_url=args.runbook_base_url).validate()


def render_all(slo: SLOConfig, out: Path, alerts_out: Path | None) -> dict[Path, str]:
    from vllm_spark_plugin.grafana import dashboards, rules
    from vllm_spark_plugin.grafana.render import dashboard_json

    files = {out / name: dashboard_json(d) for name, d in dashboards.build_all(slo).items()}
    if alerts_out is not None:
        files.update({alerts_out / name: text for name, text in rules.render_files(slo).items()})
    return files


def run(args: argparse.Namespace) -> int:
    from vllm_spark_plugin.grafana.render import write_if_changed

    try:
        slo = slo_from_args(args)
    except SLOError as exc:
        print(f"vllm-spark dashboards: {exc}", file=sys.stderr)
        return 2
    alerts_out = None if args.alerts_out == "-" else Path(args.alerts_out)
    files = render_all(slo, Path(args.out), alerts_out)
    if args.check:
        stale = [p for p, text in files.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
        for p in stale:
            print(f"differs from a regeneration: {p}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in files.items():
        try:
            changed = write_if_changed(path, text)
        except OSError as exc:
            print(f"vllm-spark dashboards: cannot write {path}: {exc.strerror}", file=sys.stderr)
            return 1
        print(f"{'wrote' if changed else 'unchanged'} {path}")
    return 0
