"""Every PromQL query of a dashboard, with Grafana's template variables substituted for testing."""
from __future__ import annotations

import re
from typing import Iterator, Mapping

# What Grafana would put in for its built-in variables during a short test against a fresh Prometheus.
DEFAULT_VARIABLES: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
    "datasource": "prometheus",
    "model": ".*",
    "instance": ".*",
}

_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Replace $name / ${name} / ${name:fmt}; an unknown variable is an error naming it."""
    values = {**DEFAULT_VARIABLES, **(variables or {})}

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"template variable ${name} has no test value (in {expr!r})")
        return values[name]

    return _VAR.sub(repl, expr)


def _walk_panels(panels) -> Iterator[dict]:
    for p in panels or []:
        yield p
        yield from _walk_panels(p.get("panels"))


def iter_panel_queries(dashboard_json: dict, variables: Mapping[str, str] | None = None
                       ) -> list[tuple[str, str, str]]:
    """[(dashboard title, panel title, expr)] for every Prometheus target, variables substituted.

    Rows (collapsed ones included) are descended into; hidden targets are still listed.
    """
    title = dashboard_json.get("title", "?")
    out: list[tuple[str, str, str]] = []
    for panel in _walk_panels(dashboard_json.get("panels")):
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if expr:
                panel_title = substitute(panel.get("title", "?"), {"instance": "<instance>", **(variables or {})})
                ref = target.get("refId", "")
                out.append((title, f"{panel_title} [{ref}]" if ref else panel_title, substitute(expr, variables)))
    return out
