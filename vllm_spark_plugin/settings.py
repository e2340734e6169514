"""Plugin settings: environment variables (prefix SPARK_PLUGIN_, never VLLM_) and an optional file.

Precedence: environment variable > file named by SPARK_PLUGIN_CONFIG (JSON or YAML) > default.
A bad value is reported by name and replaced by the default: settings never stop vLLM.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field, fields

log = logging.getLogger("vllm_spark_plugin")

ENV_PREFIX = "SPARK_PLUGIN_"


@dataclass(frozen=True)
class Settings:
    # master switch (the entry points stay installed; everything becomes a no-op)
    disable: bool = False
    # scheduler hook in the engine-core process: exact step time, prefill/decode split, KV blocks
    scheduler_hook: bool = True
    # per-stream decode-rate floors (tok/s) for capacity_streams; seed 003 uses 20
    floors: tuple[float, ...] = (20.0,)
    # TTFT SLO (seconds) for capacity with a TTFT bound and the alerts; on a TTFT bucket bound
    ttft_slo_seconds: float = 2.0
    # online knee estimator: steps kept, and the half-life that forgets old steps
    knee_window: int = 4096
    knee_halflife_seconds: float = 600.0
    knee_refit_seconds: float = 10.0
    # offline capacity profile (written by `vllm-spark bench`) shown beside the live knee
    profile: str = ""
    # hardware telemetry (NVML, /proc) sampling period
    hardware_interval_seconds: float = 1.0
    # OpenTelemetry bridge: OTLP/HTTP metrics endpoint (off when empty)
    otel_endpoint: str = ""
    otel_interval_seconds: float = 10.0
    # MoE backend override for NVFP4 MoE layers (vLLM's --moe-backend always wins)
    moe_backend: str = ""
    # allowed unified-memory headroom checks
    memory_guard: bool = True
    # the kernel log followed for NVRM driver events: a /dev/kmsg-format path, or off
    kernel_log: str = "/dev/kmsg"
    # per-stream rates and the SLO timed where the API server hands tokens to the client (off: the
    # engine core's clock, as vLLM's own decode time)
    delivery_clock: bool = True
    extra: dict = field(default_factory=dict)


def _parse(kind, raw):
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"expected a boolean, got {raw!r}")
    if kind is int:
        v = int(raw)
        if v <= 0:
            raise ValueError(f"expected a positive integer, got {raw!r}")
        return v
    if kind is float:
        v = float(raw)
        if not (v > 0 and v != float("inf")):
            raise ValueError(f"expected a positive finite number, got {raw!r}")
        return v
    if kind == "floats":
        items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
        vals = tuple(sorted({_parse(float, x) for x in items if str(x).strip()}))
        if not vals:
            raise ValueError(f"expected a comma-separated list of positive numbers, got {raw!r}")
        return vals
    return str(raw)


_KINDS = {"disable": bool, "scheduler_hook": bool, "floors": "floats", "ttft_slo_seconds": float,
          "knee_window": int, "knee_halflife_seconds": float, "knee_refit_seconds": float,
          "profile": str, "hardware_interval_seconds": float, "otel_endpoint": str,
          "otel_interval_seconds": float, "moe_backend": str, "memory_guard": bool,
          "kernel_log": str, "delivery_clock": bool}


def _read_file(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if path.endswith((".yaml", ".yml")):
        import yaml
        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def load(environ=None) -> Settings:
    """Read settings; problems are logged with the offending name and the default is kept."""
    env = os.environ if environ is None else environ
    values: dict = {}
    cfg_path = env.get(ENV_PREFIX + "CONFIG", "")
    if cfg_path:
        try:
            values.update(_read_file(cfg_path))
        except Exception as exc:  # never stop vLLM over a settings file
            log.warning("vllm-spark-plugin: ignoring settings file %s: %s", cfg_path, exc)
    for f in fields(Settings):
        key = ENV_PREFIX + f.name.upper()
        if key in env:
            values[f.name] = env[key]
    out = {}
    unknown = {}
    for name, raw in values.items():
        kind = _KINDS.get(name)
        if kind is None:
            unknown[name] = raw
            continue
        try:
            out[name] = _parse(kind, raw)
        except (TypeError, ValueError) as exc:
            log.warning("vllm-spark-plugin: setting %s%s: %s; using the default", ENV_PREFIX, name.upper(), exc)
    if unknown:
        log.warning("vllm-spark-plugin: unknown settings ignored: %s", ", ".join(sorted(unknown)))
    return Settings(**out, extra=unknown)


_current: Settings | None = None


def current() -> Settings:
    """The process's one settings instance: loaded (and its problems logged) once, on first use."""
    global _current
    if _current is None:
        _current = load()
    return _current


def reset_current() -> None:
    """Forget the loaded settings (tests that change the environment)."""
    global _current
    _current = None
