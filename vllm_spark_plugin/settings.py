"""The one owner of the plugin's settings: every `SPARK_PLUGIN_*` key is named, parsed and validated
here, the latency SLO by the same rule the dashboard and alert generator uses
(`definitions.check_ttft_slo` / `check_floors`).

Precedence: environment variable > file named by SPARK_PLUGIN_CONFIG (JSON or YAML) > default.  A bad
value is reported once, by name, with the fix, and the default is kept (in a list of floors, the bad
items are named and the others kept): settings never stop vLLM.  The
problems found are kept on the loaded object (`Settings.problems`) so that `vllm-spark doctor` shows
the same ones the server logged.

Who reads them: the inbound side (`hooks`) loads the process's settings once (`current()`) and hands
them to the domain objects it builds; domain code takes settings as an argument and never calls
`current()` itself.  The keys the plugin sets for its own processes (`INTERNAL`) are read live, since
the first process of a `vllm serve` sets them after its settings are loaded.
"""
from __future__ import annotations

import difflib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import NamedTuple

from vllm_spark_plugin.common.link_sources import INTERFACE_NAME, MAX_INTERFACES
from vllm_spark_plugin.common.memory_sources import KMSG_PATH
from vllm_spark_plugin.definitions import (
    DEFAULT_FLOOR_TOKENS_PER_SECOND,
    DEFAULT_TTFT_SLO_SECONDS,
    SLOError,
    check_floors,
    check_ttft_slo,
)

log = logging.getLogger("vllm_spark_plugin")

ENV_PREFIX = "SPARK_PLUGIN_"
OFF = ("off", "0", "false", "no", "none")


@dataclass(frozen=True)
class Settings:
    # master switch (the entry points stay installed; everything becomes a no-op)
    disable: bool = False
    # scheduler hook in the engine-core process: exact step time, prefill/decode split, KV blocks
    scheduler_hook: bool = True
    # per-stream decode-rate floors (tok/s) for capacity_streams and the SLO, each a bound of the
    # per-stream-rate histograms; seed 003 uses 20
    floors: tuple[float, ...] = (DEFAULT_FLOOR_TOKENS_PER_SECOND,)
    # TTFT SLO (seconds) requests are judged by; any positive value (a bound of the TTFT histogram)
    ttft_slo_seconds: float = DEFAULT_TTFT_SLO_SECONDS
    # online knee estimator: steps kept, the half-life that forgets old steps, the refit period
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
    # MoE backend override for NVFP4 MoE layers (vLLM's --moe-backend always wins; lower case)
    moe_backend: str = ""
    # unified-memory headroom checks at start-up
    memory_guard: bool = True
    # the kernel log followed for NVRM driver events: an absolute /dev/kmsg-format path, or "" (off)
    kernel_log: str = KMSG_PATH
    # per-stream rates and the SLO timed where the API server hands tokens to the client (off: the
    # engine core's clock, as vLLM's own decode time)
    delivery_clock: bool = True
    # the SLO guard in the engine core (docs/guard.md): off, admission (cap running requests at the live
    # capacity), prefill (bound the prefill per step while decode streams run), both
    guard: str = "off"
    # the network links followed on /metrics (docs/links.md): auto (RDMA ports, NCCL and Gloo
    # interfaces), off, or interface names, comma-separated
    links: str = "auto"
    extra: dict = field(default_factory=dict)  # keys of the settings file this release does not know
    problems: tuple[str, ...] = ()  # what was wrong with the given values, one line each

    @property
    def first_floor(self) -> float:
        return self.floors[0]

    @property
    def guard_on(self) -> bool:
        """The guard is asked for (SPARK_PLUGIN_GUARD is not off): the `guard` patch's switch."""
        return self.guard != "off"


# The keys the plugin sets for its own processes or its tools: read live, never from the file.
RUN_DIR_KEY = ENV_PREFIX + "RUN_DIR"        # the run directory of one `vllm serve` (hooks.channel)
MOE_STATE_KEY = ENV_PREFIX + "MOE_STATE"    # where the MoE policy's decision is shared (moe.policy)
TINY_MODEL_KEY = ENV_PREFIX + "TINY_MODEL"  # where the tiny test model is built (testbed)
CONFIG_KEY = ENV_PREFIX + "CONFIG"          # the settings file
INTERNAL = {RUN_DIR_KEY, MOE_STATE_KEY, TINY_MODEL_KEY, CONFIG_KEY}


def _bool(raw) -> bool:
    if isinstance(raw, bool):
        return raw
    s = str(raw).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected a boolean (1/0, true/false, on/off)")


def _positive_int(raw) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected a positive integer")
    try:
        v = int(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a positive integer") from None
    if v <= 0:
        raise ValueError("expected a positive integer")
    return v


def _positive_float(raw) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a positive finite number")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a positive finite number") from None
    if not (v > 0 and v != float("inf")):
        raise ValueError("expected a positive finite number")
    return v


def _kernel_log(raw) -> str:
    s = str(raw).strip()
    if not s:
        return KMSG_PATH
    if s.lower() in OFF:
        return ""
    if not os.path.isabs(s):
        raise ValueError(f"expected 'off' or an absolute path (default {KMSG_PATH})")
    return s


GUARD_MODES = ("off", "admission", "prefill", "both")


def _guard(raw) -> str:
    s = str(raw).strip().lower()
    if s in OFF or s == "":
        return "off"
    if s not in GUARD_MODES:
        raise ValueError(f"expected one of {', '.join(GUARD_MODES)}")
    return s


def _links(raw) -> str:
    s = str(raw).strip()
    if s.lower() in ("", "auto"):
        return "auto"
    if s.lower() in OFF:
        return "off"
    names = list(dict.fromkeys(n.strip() for n in s.split(",") if n.strip()))
    bad = [n for n in names if not INTERFACE_NAME.fullmatch(n)]
    if bad or not names or len(names) > MAX_INTERFACES:
        why = f"not interface names: {', '.join(bad)}; " if bad else ""
        raise ValueError(f"{why}expected 'auto', 'off' or up to {MAX_INTERFACES} comma-separated interface "
                         "names (letters, digits and _ . : -, 1-15 characters each)")
    return ",".join(names)


def _lower(raw) -> str:
    return str(raw).strip().lower()


def _slo(check):
    def parse(raw):
        try:
            return check(raw)
        except SLOError as exc:
            raise ValueError(str(exc)) from None
    return parse


class _Kept(NamedTuple):
    """A parsed value that kept the good items of the given list: `load` names the dropped ones."""
    value: object
    dropped: tuple[str, ...]


def _floors(raw):
    dropped: list[str] = []
    floors = _slo(lambda r: check_floors(r, dropped))(raw)
    return _Kept(floors, tuple(dropped)) if dropped else floors


PARSERS = {"disable": _bool, "scheduler_hook": _bool, "floors": _floors,
           "ttft_slo_seconds": _slo(check_ttft_slo), "knee_window": _positive_int,
           "knee_halflife_seconds": _positive_float, "knee_refit_seconds": _positive_float,
           "profile": str, "hardware_interval_seconds": _positive_float, "otel_endpoint": str,
           "otel_interval_seconds": _positive_float, "moe_backend": _lower, "memory_guard": _bool,
           "kernel_log": _kernel_log, "delivery_clock": _bool, "guard": _guard, "links": _links}
KEYS = {ENV_PREFIX + name.upper(): name for name in PARSERS}


def _text(value) -> str:
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value)
    return f"{value:g}" if isinstance(value, float) else repr(value)


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


def load(environ=None, announce: bool = True) -> Settings:
    """Read and validate every setting; each problem is one line naming the key and the fix (logged
    when `announce`), and the default is kept for that key."""
    env = os.environ if environ is None else environ
    values: dict = {}
    problems: list[str] = []
    cfg_path = env.get(CONFIG_KEY, "")
    if cfg_path:
        try:
            values.update(_read_file(cfg_path))
        except Exception as exc:  # never stop vLLM over a settings file
            problems.append(f"settings file {CONFIG_KEY}={cfg_path}: {exc}; ignored")
    for key, name in KEYS.items():
        if key in env:
            values[name] = env[key]
    for key in sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in KEYS and k not in INTERNAL):
        near = difflib.get_close_matches(key, list(KEYS) + sorted(INTERNAL), n=1)
        problems.append(f"unknown setting {key} ignored" + (f" (did you mean {near[0]}?)" if near else ""))
    defaults = Settings()
    out, unknown = {}, {}
    for name, raw in values.items():
        parse = PARSERS.get(name)
        if parse is None:
            unknown[name] = raw
            continue
        try:
            value = parse(raw)
        except (TypeError, ValueError) as exc:
            problems.append(f"setting {ENV_PREFIX}{name.upper()}={raw!r}: {exc}; using the default "
                            f"{_text(getattr(defaults, name))}")
            continue
        if isinstance(value, _Kept):  # one bad item of a list: named, the others kept
            problems.append(f"setting {ENV_PREFIX}{name.upper()}={raw!r}: {'; '.join(value.dropped)}; "
                            f"kept {_text(value.value)}")
            value = value.value
        out[name] = value
    if unknown:
        problems.append("unknown settings in the settings file ignored: " + ", ".join(sorted(unknown)))
    if announce:
        for p in problems:
            log.warning("vllm-spark-plugin: %s", p)
    return Settings(**out, extra=unknown, problems=tuple(problems))


def internal(key: str, environ=None) -> str:
    """The live value of one of the plugin's own keys (`INTERNAL`), "" when unset."""
    if key not in INTERNAL:
        raise KeyError(f"{key} is not one of the plugin's internal keys")
    env = os.environ if environ is None else environ
    return env.get(key, "")


_current: Settings | None = None


def current() -> Settings:
    """The process's one settings instance, loaded (and its problems logged) on first use.  Called by
    the inbound side and the command-line tools; domain code is handed its settings."""
    global _current
    if _current is None:
        _current = load()
    return _current


def reset_current() -> None:
    """Forget the loaded settings (tests that change the environment)."""
    global _current
    _current = None
