"""`rules_floors`: the per-stream floors the generated Prometheus rules select against the floors a
running server exports (`vllm-spark doctor --endpoint URL [--rules FILE_OR_DIR]`).

The rules (`vllm-spark dashboards --floor F`) pick the server's capacity and SLO series by their
`floor` label; rules generated for a floor the server does not export (SPARK_PLUGIN_FLOORS) select
nothing, and their SLO alerts stay silent without a word.  A server's floors are the `floor` labels
of its capacity gauge and SLO counters on /metrics (the counters exist from the engine's start); a
rules file's floors are its `floor` matchers.  The histogram bounds the rules select (`le`: each
floor and the TTFT SLO) must be buckets the server exports too (`metrics.bounds.unmatched_bounds`).  Without `--rules` doctor reads the deploy's rules:
the repository's `alerts/` (compose mounts it) or the systemd deploy's folder.
"""
from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

from vllm_spark_plugin.doctor.check import FAIL, INFO, NA, OK, WARN, Check
from vllm_spark_plugin.metrics import bounds
from vllm_spark_plugin.metrics import names as N

NAME = "rules_floors"
RULES_HOMES = ("alerts", "/etc/vllm-spark/prometheus/rules")  # the repository's; deploy/systemd/install.sh's
SERVER_SERIES = (N.CAPACITY_STREAMS, N.SLO_REQUESTS, N.SLO_OUTPUT_TOKENS)
FETCH_SECONDS = 10.0
REGENERATE = "vllm-spark dashboards --floor {floor} --alerts-out {folder}"
_MATCHER = re.compile(r'\bfloor\s*=~?\s*"([^"]*)"')


def _floors_text(floors) -> str:
    return ", ".join(f"{f:g}" for f in floors) + " tok/s"


def metrics_url(endpoint: str) -> str:
    """A server's /metrics from what the user gave: `HOST:PORT`, a base URL or the /metrics URL."""
    url = endpoint.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/metrics") else url + "/metrics"


def server_floors(metrics_text: str) -> list[float]:
    """The floors a server exports: the `floor` labels of its capacity gauge and SLO counters."""
    from prometheus_client.parser import text_string_to_metric_families
    found = set()
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name in SERVER_SERIES and "floor" in s.labels:
                found.add(float(s.labels["floor"]))
    return sorted(found)


def _matcher_floor(value: str) -> float | None:
    """A floor matcher's value as `grafana.promql.floor_matcher` writes it ("20(\\\\.0+)?", "12\\\\.50*",
    or a plain "20") -> 20.0; None for a matcher that is not a single floor."""
    text = value.replace("(\\\\.0+)?", "").replace("(\\.0+)?", "").replace("\\", "")
    if text.endswith("0*"):
        text = text[:-2]
    try:
        return float(text)
    except ValueError:
        return None


def rules_floors(rules_text: str) -> list[float]:
    """The floors a Prometheus rules file selects (every `floor` matcher of its expressions);
    ValueError when the text is not a rules file."""
    found = set()
    for expr in bounds.rule_expressions(rules_text):
        for value in _MATCHER.findall(expr):
            floor = _matcher_floor(value)
            if floor is not None:
                found.add(floor)
    return sorted(found)


def rule_files(given: tuple[str, ...] | list[str]) -> list[Path]:
    """The rules files to read: each given file, every *.yml in each given folder; without any, the
    first deploy folder (RULES_HOMES) that holds rules.  FileNotFoundError for a given path that
    does not exist."""
    paths = [Path(p) for p in given]
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"--rules {p}: no such file or folder")
    if not paths:
        paths = [Path(h) for h in RULES_HOMES if sorted(Path(h).glob("*.rules.yml"))][:1]
    files: list[Path] = []
    for p in paths:
        files += sorted(p.glob("*.yml")) + sorted(p.glob("*.yaml")) if p.is_dir() else [p]
    return files


def fetch_metrics(endpoint: str, timeout: float = FETCH_SECONDS) -> str:
    with urllib.request.urlopen(metrics_url(endpoint), timeout=timeout) as resp:
        return resp.read().decode("utf-8", errors="replace")


def check(ctx) -> Check:
    if not ctx.endpoint:
        return Check(NAME, NA, "no server given: pass --endpoint http://HOST:PORT (and --rules FILE_OR_DIR) to "
                     "compare the floors the Prometheus rules select with the floors the server exports")
    try:
        files = rule_files(ctx.rules)
    except FileNotFoundError as exc:
        return Check(NAME, FAIL, str(exc), "pass the rules file or folder Prometheus loads")
    if not files:
        return Check(NAME, WARN, "no rules file found (looked in " + ", ".join(f"{h}/" for h in RULES_HOMES) + ")",
                     "pass --rules FILE_OR_DIR: the rules Prometheus loads for this server")
    rules: set[float] = set()
    texts = []
    for f in files:
        try:
            texts.append(f.read_text(encoding="utf-8"))
            rules.update(rules_floors(texts[-1]))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return Check(NAME, FAIL, f"{f}: {exc}", "pass the rules files `vllm-spark dashboards` wrote (--rules)")
    where = ", ".join(str(f) for f in files)
    if not rules:
        return Check(NAME, WARN, f"{where}: no rule selects a floor (not rules from `vllm-spark dashboards`?)",
                     "pass the rules `vllm-spark dashboards` wrote (--rules FILE_OR_DIR)")
    url = metrics_url(ctx.endpoint)
    try:
        metrics_text = fetch_metrics(ctx.endpoint)
        server = server_floors(metrics_text)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return Check(NAME, FAIL, f"cannot read {url}: {getattr(exc, 'reason', None) or exc}",
                     "pass the server's base URL (--endpoint http://HOST:PORT) and check that it serves")
    if not server:
        return Check(NAME, FAIL, f"{url} exports none of {', '.join(SERVER_SERIES)}: the plugin is not loaded "
                     "there or no engine has started", "run `vllm-spark doctor` on the server's host (plugin, VLLM_PLUGINS)")
    said = f"the rules ({where}) select {_floors_text(sorted(rules))}; the server ({url}) exports {_floors_text(server)}"
    missing = sorted(rules - set(server))
    unmatched = sorted({u for text in texts for u in bounds.unmatched_bounds(text, metrics_text)})
    if missing or unmatched:
        wrong = ([f"rules on {_floors_text(missing)} select no series"] if missing else []) + (
            ["they read buckets the server does not export: " + "; ".join(unmatched)] if unmatched else [])
        return Check(NAME, FAIL, f"{said}: " + ", and ".join(wrong) + ", so their SLO alerts stay silent",
                     "regenerate the rules for the server's SLO: "
                     + REGENERATE.format(floor=f"{server[0]:g}", folder=files[0].parent)
                     + " (with the server's TTFT SLO as --ttft-slo; keep the other options, the rules' second line "
                     "lists them), then reload Prometheus"
                     + ("; or serve with SPARK_PLUGIN_FLOORS including " + ",".join(f"{f:g}" for f in missing)
                        if missing else ""))
    if set(server) - rules:
        return Check(NAME, INFO, f"{said}: no rule watches {_floors_text(sorted(set(server) - rules))}")
    return Check(NAME, OK, said)
