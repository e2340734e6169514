"""The exporter's hardware series as `/metrics` shows them: a fresh registry, the plugin's own
`Exporter` sampling the NVML this run uses, prometheus-client's text rendering, parsed back.

`scrape_hardware` is the one place this package touches the exporter.
"""
from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable

from vllm_spark_plugin.gpu_check.report import NotApplicable, Verdict, verdict
from vllm_spark_plugin.gpu_check.telemetry import TEMPERATURE_RANGE_C, direct_reading
from vllm_spark_plugin.metrics.hardware import CLOCK_EVENT_REASONS

RENDER_LOAD_SECONDS = 2.0
POWER_AGREEMENT = {"rel": 0.20, "abs_w": 20.0}   # the exporter's last sample vs NVML just after the render
ENERGY_BRACKET_MIN = 0.5  # exported energy / NVML's delta over a bracket around both samples


def scrape_hardware(nvml, between: Callable[[], object]) -> str:
    """`/metrics` text after two `Exporter.sample_hardware(nvml)` calls with `between()` (a load)
    between them; the energy counter then holds the joules of that interval."""
    from prometheus_client import CollectorRegistry, generate_latest

    from vllm_spark_plugin.metrics.exporter import Exporter
    from vllm_spark_plugin.settings import Settings

    registry = CollectorRegistry()
    # the defaults, not this shell's SPARK_PLUGIN_* variables: the same render on every machine
    exporter = Exporter("gpu-check", Settings(), registry=registry)
    exporter.sample_hardware(nvml)
    between()
    exporter.sample_hardware(nvml)
    return generate_latest(registry).decode()


def gpu_series(text: str) -> dict[str, list[tuple[dict, float]]]:
    """sample name -> [(labels, value)] for every `vllm_spark_gpu_*` sample of a /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm_spark_gpu_"):
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _value(series: dict, name: str, **labels) -> float | None:
    want = set(labels.items())
    return next((v for lab, v in series.get(name, ()) if want <= set(lab.items())), None)


def check_render(env) -> Verdict:
    if importlib.util.find_spec("prometheus_client") is None:
        raise NotApplicable("prometheus-client not installed (docs/gpu-check.md: a wheel in .whl/ is put on "
                            "the path by scripts/gpu-check.sh)")
    try:
        from vllm_spark_plugin.metrics import exporter  # noqa: F401  (its third-party imports, checked here)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "vllm_spark_plugin":
            raise
        raise NotApplicable(f"the exporter imports {exc.name}, which is not installed here (a dependency of the "
                            "plugin's package)") from None
    from vllm_spark_plugin.metrics import names

    before = direct_reading(env.nvml, env.handle)
    t0 = time.monotonic()
    text = scrape_hardware(env.nvml, lambda: env.burn(RENDER_LOAD_SECONDS if not env.dry else 0.2))
    after = direct_reading(env.nvml, env.handle)
    series = gpu_series(text)
    g = str(env.nvml_index)
    energy = _value(series, names.GPU_ENERGY, gpu=g)
    power = _value(series, names.GPU_POWER, gpu=g)
    clock = _value(series, names.GPU_SM_CLOCK, gpu=g)
    temp = _value(series, names.GPU_TEMPERATURE, gpu=g)
    util = _value(series, names.GPU_UTILIZATION, gpu=g)
    reasons = {r: _value(series, names.GPU_CLOCK_EVENT, gpu=g, reason=r) for r in CLOCK_EVENT_REASONS}
    memory = {k: _value(series, names.GPU_MEMORY, gpu=g, kind=k) for k in ("total", "free", "used")}
    problems = [f"{n} missing" for n, v in ((names.GPU_ENERGY, energy), (names.GPU_POWER, power),
                                            (names.GPU_SM_CLOCK, clock), (names.GPU_TEMPERATURE, temp),
                                            (names.GPU_UTILIZATION, util)) if v is None]
    problems += [f"{names.GPU_CLOCK_EVENT}{{reason={r!r}}} is {v}" for r, v in reasons.items() if v not in (0.0, 1.0)]
    bracket = after.get("energy_j", 0.0) - before.get("energy_j", 0.0)
    if energy is not None and not (ENERGY_BRACKET_MIN * bracket <= energy <= bracket + 1.0 and energy > 0):
        problems.append(f"energy counter {energy:.1f} J vs NVML {bracket:.1f} J around both samples")
    if power is not None and "power_w" in after and \
            abs(power - after["power_w"]) > max(POWER_AGREEMENT["abs_w"], POWER_AGREEMENT["rel"] * after["power_w"]):
        problems.append(f"power {power:.1f} W vs NVML {after['power_w']:.1f} W")
    if temp is not None and not TEMPERATURE_RANGE_C[0] < temp < TEMPERATURE_RANGE_C[1]:
        problems.append(f"temperature {temp} C")
    if util is not None and not 0 <= util <= 1:
        problems.append(f"utilisation {util}")
    nvml_memory = "memory" in after
    if nvml_memory and any(v is None for v in memory.values()):
        problems.append(f"NVML reports memory but {names.GPU_MEMORY} has {memory}")
    if not nvml_memory and any(v is not None for v in memory.values()):
        problems.append(f"NVML reports no memory but {names.GPU_MEMORY} has {memory}")
    shown = lambda v, fmt: "missing" if v is None else fmt.format(v)  # noqa: E731
    detail = (f"{sum(len(v) for v in series.values())} vllm_spark_gpu_* samples on /metrics: energy "
              f"{shown(energy, '{:.1f} J')} (NVML {bracket:.1f} J around the samples), power {shown(power, '{:.0f} W')}, "
              f"SM clock {shown(clock and clock / 1e6, '{:.0f} MHz')}, temperature {shown(temp, '{:.0f} C')}, "
              f"utilisation {shown(util, '{:.0%}')}, {sum(v is not None for v in reasons.values())} clock-event "
              f"reasons, memory {'present' if nvml_memory else 'absent (NVML reports none)'}")
    if problems:
        detail += "; " + "; ".join(problems)
    return verdict(not problems, detail, series={k: [[lab, v] for lab, v in vals] for k, vals in series.items()},
                   nvml_energy_bracket_j=bracket, seconds=round(time.monotonic() - t0, 2))
