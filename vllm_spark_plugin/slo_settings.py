"""The latency SLO the exporter judges requests by: `SPARK_PLUGIN_TTFT_SLO_SECONDS` and
`SPARK_PLUGIN_FLOORS`.

`parse_ttft_slo` and `parse_floors` are the validators of those two settings (raising ValueError with
the reason); `load` reads them from an environment, and `from_settings` from an already loaded
settings object.  A bad value (negative, zero, not a number, infinite) is logged once, naming the
setting, and the default is kept: SLO settings never stop vLLM.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

from vllm_spark_plugin.definitions import DEFAULT_FLOOR_TOKENS_PER_SECOND

log = logging.getLogger("vllm_spark_plugin")

TTFT_SLO_ENV = "SPARK_PLUGIN_TTFT_SLO_SECONDS"
FLOORS_ENV = "SPARK_PLUGIN_FLOORS"
DEFAULT_TTFT_SLO_SECONDS = 2.0
DEFAULT_FLOORS = (DEFAULT_FLOOR_TOKENS_PER_SECOND,)


@dataclass(frozen=True)
class SloSettings:
    ttft_slo_seconds: float = DEFAULT_TTFT_SLO_SECONDS
    floors: tuple[float, ...] = DEFAULT_FLOORS  # ascending, distinct


def _positive(raw, what: str) -> float:
    if isinstance(raw, bool):
        raise ValueError(f"expected {what}, got {raw!r}")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"expected {what}, got {raw!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"expected {what}, got {raw!r}")
    return v


def parse_ttft_slo(raw) -> float:
    """Seconds, a positive finite number."""
    return _positive(raw, "a positive number of seconds")


def parse_floors(raw) -> tuple[float, ...]:
    """Comma-separated (or a list of) positive tok/s values; sorted, duplicates dropped."""
    what = "comma-separated positive tok/s values"
    items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
    try:
        vals = tuple(sorted({_positive(x, what) for x in items if str(x).strip()}))
    except ValueError:
        raise ValueError(f"expected {what}, got {raw!r}") from None
    if not vals:
        raise ValueError(f"expected {what}, got {raw!r}")
    return vals


def _text(value) -> str:
    return ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else f"{value:g}"


def _read(name: str, raw, parse, default):
    try:
        return parse(raw)
    except ValueError as exc:
        log.warning("vllm-spark-plugin: setting %s: %s; using the default %s", name, exc, _text(default))
        return default


def load(environ=None) -> SloSettings:
    """The SLO from an environment (os.environ by default); unset variables keep the defaults."""
    env = os.environ if environ is None else environ
    ttft = DEFAULT_TTFT_SLO_SECONDS
    floors = DEFAULT_FLOORS
    if TTFT_SLO_ENV in env:
        ttft = _read(TTFT_SLO_ENV, env[TTFT_SLO_ENV], parse_ttft_slo, DEFAULT_TTFT_SLO_SECONDS)
    if FLOORS_ENV in env:
        floors = _read(FLOORS_ENV, env[FLOORS_ENV], parse_floors, DEFAULT_FLOORS)
    return SloSettings(ttft_slo_seconds=ttft, floors=floors)


def from_settings(settings) -> SloSettings:
    """The SLO from a settings object with `ttft_slo_seconds` and `floors` (validated again)."""
    ttft = _read(TTFT_SLO_ENV, getattr(settings, "ttft_slo_seconds", DEFAULT_TTFT_SLO_SECONDS),
                 parse_ttft_slo, DEFAULT_TTFT_SLO_SECONDS)
    floors = _read(FLOORS_ENV, getattr(settings, "floors", DEFAULT_FLOORS), parse_floors, DEFAULT_FLOORS)
    return SloSettings(ttft_slo_seconds=ttft, floors=floors)
