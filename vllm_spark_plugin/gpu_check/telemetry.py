"""The plugin's NVML reader (`metrics.hardware.NvmlSampler`, what the exporter publishes) against
NVML read directly and `nvidia-smi`, under a timed matmul load and at idle.

One measurement serves the energy, gauge and nvidia-smi checks (`measure_load`): an idle reading,
then a window of lead + burn + tail seconds in which a thread reads power and the energy counter
every `sample_period`, both directly and through a sampler of its own, with a second reading
(plugin, direct, nvidia-smi) half way through the burn.

Energy: the counter's delta over the window against the trapezoid integral of the power gauge over
the same window, within ENERGY_TOLERANCE.  The idle margins matter: the gauge averages over about a
second, so its integral lags the load on both edges and catches up only once the window contains
the whole lag; and some counters update coarsely, which a 20 s window makes small.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from vllm_spark_plugin.gpu_check.env import as_text
from vllm_spark_plugin.gpu_check.report import NotApplicable, Verdict, verdict
from vllm_spark_plugin.metrics.hardware import CLOCK_EVENT_REASONS, NvmlSampler

MiB = 1 << 20
ENERGY_TOLERANCE = 0.10      # |counter delta - power integral| / power integral
MIN_SAMPLE_FRACTION = 0.5    # of window / period: fewer and the integral is not trustworthy
POWER_MAX_W = 2000.0         # above any single GPU's board power
SM_CLOCK_MAX_HZ = 5e9
TEMPERATURE_RANGE_C = (0.0, 110.0)
LOAD_UTILIZATION_MIN = 0.5   # a back-to-back matmul burn keeps the GPU busy
# plugin vs direct NVML read milliseconds apart; plugin and nvidia-smi a few hundred ms apart
# (clocks move by a few hundred MHz within milliseconds under a power cap: the clock tolerance is
# there to catch a unit error, MHz for Hz, not to follow the governor)
SAME_INSTANT = {"power_rel": 0.10, "power_abs_w": 5.0, "clock_rel": 0.25, "temperature_c": 2.0}
SMI_AGREEMENT = {"power_rel": 0.20, "power_abs_w": 20.0, "clock_rel": 0.25, "temperature_c": 3.0,
                 "memory_total_rel": 0.02}
MEMORY_SLACK = 64 * MiB      # allocator rounding, the CUDA context's own growth
SMI_FIELDS = "name,driver_version,power.draw,clocks.sm,temperature.gpu,utilization.gpu,memory.total,memory.used"
GAUGES = ("power_w", "sm_clock_hz", "temperature_c", "utilization", "reasons")


# -- readings ---------------------------------------------------------------------------------------
def direct_reading(nv, handle) -> dict:
    """The same quantities as NvmlSampler.sample(), read straight from NVML, in the plugin's units."""
    out: dict = {}
    for key, call, scale in (
            ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(handle), 1e-3),
            ("energy_j", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle), 1e-3),
            ("sm_clock_hz", lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM), 1e6),
            ("temperature_c", lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU), 1.0),
            ("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu, 0.01)):
        try:
            out[key] = float(call()) * scale
        except Exception as exc:
            out[key + "_error"] = type(exc).__name__
    try:
        m = nv.nvmlDeviceGetMemoryInfo(handle)
        out["memory"] = {"total": int(m.total), "free": int(m.free), "used": int(m.used)}
    except Exception as exc:
        out["memory_error"] = type(exc).__name__
    return out


def plugin_row(sampler: NvmlSampler, index: int) -> dict:
    rows = sampler.sample()
    row = next((r for r in rows if r.get("gpu") == str(index)), None)
    if row is None:
        raise RuntimeError(f"NvmlSampler returned no row for GPU {index} (rows: {[r.get('gpu') for r in rows]})")
    return row


def plugin_sampler(env) -> NvmlSampler:
    s = NvmlSampler(env.nvml)
    if not s.init():
        raise RuntimeError("NvmlSampler.init() found no NVML device (the plugin would export no GPU series)")
    return s


def trapezoid(ts: list[float], ys: list[float]) -> float:
    return sum((t1 - t0) * (y0 + y1) / 2 for t0, t1, y0, y1 in zip(ts, ts[1:], ys, ys[1:]))


class PowerTrace:
    """A thread reading power and energy every `period`: directly, and through its own NvmlSampler
    (the plugin's energy is the sum of the sampler's deltas, as the exporter's counter adds them)."""

    def __init__(self, env) -> None:
        self.nv, self.handle, self.index = env.nvml, env.handle, env.nvml_index
        self.period = env.timing.sample_period
        self.sampler = plugin_sampler(env)
        self.t: list[float] = []
        self.power_w: list[float] = []
        self.energy_j: list[float] = []
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="gpu-check-power", daemon=True)

    def _loop(self) -> None:
        try:
            nxt = time.monotonic()
            while not self._stop.is_set():
                t = time.monotonic()
                p = self.nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
                e = self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
                row = plugin_row(self.sampler, self.index)
                self.t.append(t)
                self.power_w.append(p)
                self.energy_j.append(e)
                self.rows.append(row)
                nxt += self.period
                self._stop.wait(max(0.0, nxt - time.monotonic()))
        except BaseException as exc:  # re-raised in the checking thread by stop()
            self._error = exc

    def start(self) -> "PowerTrace":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._error is not None:
            raise RuntimeError(f"the power-sampling thread failed: {type(self._error).__name__}: {self._error}")


@dataclass
class LoadRecord:
    trace: PowerTrace
    burn: dict
    burn_start: float            # monotonic
    burn_end: float
    idle: dict                   # {"plugin": row, "direct": reading, "smi": csv text or None}
    load: dict = field(default_factory=dict)
    idle_after: dict = field(default_factory=dict)

    def rows_in_burn(self) -> list[dict]:
        """Plugin rows of the burn's middle half (the gauges have settled on the load)."""
        lo = self.burn_start + (self.burn_end - self.burn_start) / 4
        hi = self.burn_end - (self.burn_end - self.burn_start) / 4
        return [r for t, r in zip(self.trace.t, self.trace.rows) if lo <= t <= hi]


def _snapshot(env, sampler: NvmlSampler) -> dict:
    snap = {"plugin": plugin_row(sampler, env.nvml_index), "direct": direct_reading(env.nvml, env.handle)}
    try:
        snap["smi"] = env.nvidia_smi(SMI_FIELDS)
    except Exception as exc:
        snap["smi_error"] = f"{type(exc).__name__}: {exc}"
    return snap


def measure_load(env) -> LoadRecord:
    """The shared measurement (run once per environment; a failure fails every check that uses it)."""
    cached = env.cache.get("load")
    if isinstance(cached, Exception):
        raise RuntimeError(f"the load measurement failed earlier: {cached}")
    if cached is not None:
        return cached
    try:
        env.cache["load"] = _measure(env)
    except Exception as exc:
        env.cache["load"] = exc
        raise
    return env.cache["load"]


def _measure(env) -> LoadRecord:
    tm = env.timing
    sampler = plugin_sampler(env)
    idle = _snapshot(env, sampler)
    env.progress(f"  energy window: {tm.lead_seconds:g} s idle, {tm.burn_seconds:g} s matmul burn, "
                 f"{tm.tail_seconds:g} s idle; power sampled every {tm.sample_period * 1000:.0f} ms")
    trace = PowerTrace(env).start()
    load: dict = {}
    # the half-way reading runs beside the burn: nvidia-smi takes a few hundred ms, and a GPU left
    # waiting for it would read as idle
    midway = threading.Thread(target=lambda: load.update(_snapshot(env, sampler)), name="gpu-check-midway",
                              daemon=True)
    try:
        time.sleep(tm.lead_seconds)
        t0 = time.monotonic()
        burn = env.burn(tm.burn_seconds, midway=midway.start)
        t1 = time.monotonic()
        midway.join(timeout=60)
        time.sleep(tm.tail_seconds)
    finally:
        trace.stop()
    rec = LoadRecord(trace=trace, burn=burn, burn_start=t0, burn_end=t1, idle=idle, load=load)
    rec.idle_after = _snapshot(env, sampler)
    return rec


# -- checks -----------------------------------------------------------------------------------------
def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else float("inf")


def energy_vs_integral(ts: list[float], energy_j: list[float], power_w: list[float]) -> dict:
    """The counter's delta against the power integral over the same span.  A counter that updates
    every few hundred ms would leave each end of the window off by up to one update: the span runs
    from the sample that first saw a new counter value to the one that saw the last new value, which
    pins each end to one sample period (the whole window when the counter changed fewer than twice)."""
    changes = [i for i in range(1, len(energy_j)) if energy_j[i] != energy_j[i - 1]]
    i0, i1 = (changes[0], changes[-1]) if len(changes) >= 2 else (0, len(ts) - 1)
    e = energy_j[i1] - energy_j[i0]
    p = trapezoid(ts[i0:i1 + 1], power_w[i0:i1 + 1])
    return {"energy_j": round(e, 1), "power_integral_j": round(p, 1), "error": round(_rel(e, p), 4),
            "span_seconds": round(ts[i1] - ts[i0], 2), "counter_updates": len(changes)}


def check_energy(env) -> Verdict:
    """Energy counter monotone, and its delta = the power integral within ENERGY_TOLERANCE, read
    directly and through the plugin's sampler."""
    rec = measure_load(env)
    tr = rec.trace
    n = len(tr.t)
    if n < 3:
        return verdict(False, f"only {n} power sample(s) in the window")
    if any("power_w" not in r or "energy_delta_j" not in r for r in tr.rows):
        return verdict(False, "the plugin's sampler returned no power or energy for some samples")
    window = tr.t[-1] - tr.t[0]
    backwards = sum(1 for a, b in zip(tr.energy_j, tr.energy_j[1:]) if b < a)
    direct = energy_vs_integral(tr.t, tr.energy_j, tr.power_w)
    cumulative, total = [], 0.0
    for r in tr.rows:  # the exporter's counter: the sum of the sampler's deltas
        total += r["energy_delta_j"]
        cumulative.append(total)
    plugin = energy_vs_integral(tr.t, cumulative, [r["power_w"] for r in tr.rows])
    enough = n >= MIN_SAMPLE_FRACTION * window / env.timing.sample_period
    problems = [p for p, bad in (
        (f"energy counter went backwards {backwards} time(s)", backwards),
        ("energy counter did not advance", direct["energy_j"] <= 0),
        (f"only {n} samples in {window:.1f} s (sampling fell behind)", not enough)) if bad]
    ok = not problems and direct["error"] <= ENERGY_TOLERANCE and plugin["error"] <= ENERGY_TOLERANCE
    detail = (f"energy {direct['energy_j']:.0f} J (plugin {plugin['energy_j']:.0f} J) vs power integral "
              f"{direct['power_integral_j']:.0f} J (plugin {plugin['power_integral_j']:.0f} J) over "
              f"{direct['span_seconds']:.1f} s: {direct['error']:.1%} / {plugin['error']:.1%} (needs <= "
              f"{ENERGY_TOLERANCE:.0%}); counter changed {direct['counter_updates']} times in {n} samples"
              + ("; " + "; ".join(problems) if problems else ""))
    return verdict(ok, detail, window_seconds=round(window, 2), samples=n, backwards_steps=backwards,
                   mean_power_w=round(direct["power_integral_j"] / direct["span_seconds"], 1)
                   if direct["span_seconds"] else None,
                   tolerance=ENERGY_TOLERANCE, **direct, **{f"plugin_{k}": v for k, v in plugin.items()}, **rec.burn)


def _gauge_problems(row: dict, when: str) -> list[str]:
    out = [f"{when}: {k} missing" for k in GAUGES if k not in row]
    p, clk, t, u = (row.get(k) for k in ("power_w", "sm_clock_hz", "temperature_c", "utilization"))
    if p is not None and not 0 < p < POWER_MAX_W:
        out.append(f"{when}: power {p} W out of (0, {POWER_MAX_W:g})")
    if clk is not None and not 0 < clk <= SM_CLOCK_MAX_HZ:
        out.append(f"{when}: SM clock {clk} Hz out of (0, {SM_CLOCK_MAX_HZ:g}]")
    if t is not None and not TEMPERATURE_RANGE_C[0] < t < TEMPERATURE_RANGE_C[1]:
        out.append(f"{when}: temperature {t} C out of {TEMPERATURE_RANGE_C}")
    if u is not None and not 0 <= u <= 1:
        out.append(f"{when}: utilisation {u} out of [0, 1]")
    reasons = row.get("reasons")
    if reasons is not None:
        if set(reasons) != set(CLOCK_EVENT_REASONS):
            out.append(f"{when}: clock-event reasons {sorted(reasons)} != {sorted(CLOCK_EVENT_REASONS)}")
        if any(v not in (0, 1) for v in reasons.values()):
            out.append(f"{when}: a clock-event reason is not 0/1: {reasons}")
    return out


def _same_instant_problems(row: dict, direct: dict, when: str) -> list[str]:
    out = []
    tol = SAME_INSTANT
    if "power_w" in row and "power_w" in direct and \
            abs(row["power_w"] - direct["power_w"]) > max(tol["power_abs_w"], tol["power_rel"] * direct["power_w"]):
        out.append(f"{when}: plugin power {row['power_w']:.1f} W vs NVML {direct['power_w']:.1f} W")
    if "sm_clock_hz" in row and "sm_clock_hz" in direct and \
            _rel(row["sm_clock_hz"], direct["sm_clock_hz"]) > tol["clock_rel"]:
        out.append(f"{when}: plugin SM clock {row['sm_clock_hz']:.3g} Hz vs NVML {direct['sm_clock_hz']:.3g} Hz")
    if "temperature_c" in row and "temperature_c" in direct and \
            abs(row["temperature_c"] - direct["temperature_c"]) > tol["temperature_c"]:
        out.append(f"{when}: plugin temperature {row['temperature_c']} C vs NVML {direct['temperature_c']} C")
    return out


def check_gauges(env) -> Verdict:
    """Power, SM clock, temperature, utilisation and clock-event reasons present and sane at idle and
    under load, and equal to NVML read directly at the same instant."""
    rec = measure_load(env)
    idle, load = rec.idle.get("plugin", {}), rec.load.get("plugin", {})
    if not load:
        return verdict(False, "no reading was taken half way through the burn")
    problems = _gauge_problems(idle, "idle") + _gauge_problems(load, "load")
    problems += _same_instant_problems(idle, rec.idle["direct"], "idle")
    problems += _same_instant_problems(load, rec.load["direct"], "load")
    mid = rec.rows_in_burn() or [load]
    med = {k: statistics.median(r[k] for r in mid if k in r) for k in ("power_w", "utilization", "sm_clock_hz")
           if any(k in r for r in mid)}
    idle_busy = sum(r.get("reasons", {}).get("gpu_idle", 0) for r in mid)
    if med.get("power_w", 0) <= idle.get("power_w", float("inf")):
        problems.append(f"power under load {med.get('power_w')} W not above idle {idle.get('power_w')} W")
    if med.get("utilization", 0) < LOAD_UTILIZATION_MIN:
        problems.append(f"utilisation under load {med.get('utilization')} < {LOAD_UTILIZATION_MIN}")
    if idle_busy > len(mid) / 2:
        problems.append(f"clock-event reason gpu_idle set in {idle_busy} of {len(mid)} readings under load")
    active = lambda row: sorted(k for k, v in row.get("reasons", {}).items() if v)  # noqa: E731
    detail = (f"idle {idle.get('power_w', 0):.0f} W, {idle.get('sm_clock_hz', 0) / 1e6:.0f} MHz, "
              f"{idle.get('temperature_c', 0):.0f} C, util {idle.get('utilization', 0):.0%}, reasons {active(idle)}; "
              f"load {med.get('power_w', 0):.0f} W, {med.get('sm_clock_hz', 0) / 1e6:.0f} MHz, "
              f"{load.get('temperature_c', 0):.0f} C, util {med.get('utilization', 0):.0%}, reasons {active(load)}")
    if problems:
        detail += "; " + "; ".join(problems)
    return verdict(not problems, detail, idle=_gauges(idle), load=_gauges(load), load_median=med,
                   idle_after=_gauges(rec.idle_after.get("plugin", {})), readings_under_load=len(mid))


def _gauges(row: dict) -> dict:
    return {k: row.get(k) for k in GAUGES}


def parse_smi(text: str) -> dict:
    """One CSV line of `nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits` -> field:
    value (numbers as floats; N/A and Not Supported as None)."""
    names = SMI_FIELDS.split(",")
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(names):
        raise ValueError(f"nvidia-smi answered {len(values)} fields, asked for {len(names)}: {line!r}")
    out: dict = {}
    for k, v in zip(names, values):
        if v.strip("[]").lower() in ("n/a", "not supported", "unknown error", ""):
            out[k] = None
        elif k in ("name", "driver_version"):
            out[k] = v
        else:
            out[k] = float(v)
    return out


def _smi_problems(smi: dict, row: dict, when: str) -> list[str]:
    tol = SMI_AGREEMENT
    out = []
    if smi.get("power.draw") is not None and "power_w" in row and \
            abs(smi["power.draw"] - row["power_w"]) > max(tol["power_abs_w"], tol["power_rel"] * smi["power.draw"]):
        out.append(f"{when}: power {smi['power.draw']} W vs plugin {row['power_w']:.1f} W")
    if smi.get("clocks.sm") is not None and "sm_clock_hz" in row and \
            _rel(row["sm_clock_hz"], smi["clocks.sm"] * 1e6) > tol["clock_rel"]:
        out.append(f"{when}: SM clock {smi['clocks.sm']:.0f} MHz vs plugin {row['sm_clock_hz'] / 1e6:.0f} MHz")
    if smi.get("temperature.gpu") is not None and "temperature_c" in row and \
            abs(smi["temperature.gpu"] - row["temperature_c"]) > tol["temperature_c"]:
        out.append(f"{when}: temperature {smi['temperature.gpu']} C vs plugin {row['temperature_c']} C")
    mem = row.get("memory")
    if smi.get("memory.total") is not None and mem and \
            _rel(smi["memory.total"] * MiB, mem["total"]) > tol["memory_total_rel"]:
        out.append(f"{when}: memory.total {smi['memory.total']:.0f} MiB vs plugin {mem['total'] / MiB:.0f} MiB")
    if (smi.get("memory.total") is None) != (mem is None):
        out.append(f"{when}: nvidia-smi memory {'absent' if smi.get('memory.total') is None else 'present'} but "
                   f"NVML memory {'absent' if mem is None else 'present'}")
    return out


def check_nvidia_smi(env) -> Verdict:
    """nvidia-smi (a second NVML client) agrees with the plugin's readings, idle and under load."""
    rec = measure_load(env)
    if not rec.load:
        return verdict(False, "no reading was taken half way through the burn")
    for snap in (rec.idle, rec.load):
        if "smi_error" in snap:
            return verdict(False, f"nvidia-smi failed: {snap['smi_error']}")
    if rec.idle.get("smi") is None:
        raise NotApplicable("nvidia-smi is not on PATH here")
    idle, load = parse_smi(rec.idle["smi"]), parse_smi(rec.load["smi"])
    name, driver = as_text(env.nvml.nvmlDeviceGetName(env.handle)), as_text(env.nvml.nvmlSystemGetDriverVersion())
    problems = []
    if idle["name"] != name:
        problems.append(f"name {idle['name']!r} vs NVML {name!r}")
    if idle["driver_version"] != driver:
        problems.append(f"driver {idle['driver_version']!r} vs NVML {driver!r}")
    problems += _smi_problems(idle, rec.idle["plugin"], "idle")
    problems += _smi_problems(load, rec.load["plugin"], "load")
    if load.get("utilization.gpu") is not None and load["utilization.gpu"] < 100 * LOAD_UTILIZATION_MIN:
        problems.append(f"load: nvidia-smi utilisation {load['utilization.gpu']}% < {LOAD_UTILIZATION_MIN:.0%}")
    detail = (f"nvidia-smi idle {idle.get('power.draw')} W / {idle.get('clocks.sm')} MHz / {idle.get('temperature.gpu')} C, "
              f"load {load.get('power.draw')} W / {load.get('clocks.sm')} MHz / {load.get('utilization.gpu')}% "
              f"agree with the plugin")
    if problems:
        detail = "; ".join(problems)
    return verdict(not problems, detail, idle=idle, load=load, tolerances=SMI_AGREEMENT)


def check_memory(env) -> Verdict:
    """NVML's GPU memory (through the plugin's sampler) follows a known allocation, as
    torch.cuda.mem_get_info does."""
    sampler = plugin_sampler(env)
    env.quiesce()
    row0 = plugin_row(sampler, env.nvml_index)
    free0, total = env.mem_get_info()
    if "memory" not in row0:
        raise NotApplicable(f"NVML reports no GPU memory here (NOT_SUPPORTED: unified memory, as on GB10; the "
                            f"plugin reads /proc/meminfo there); CUDA reports {free0 / 2**30:.1f} of "
                            f"{total / 2**30:.1f} GiB free")
    size = env.timing.alloc_bytes
    held = env.allocate(size)
    try:
        row1 = plugin_row(sampler, env.nvml_index)
        free1, _ = env.mem_get_info()
        direct1 = direct_reading(env.nvml, env.handle).get("memory", {})
    finally:
        env.release(held)
    row2 = plugin_row(sampler, env.nvml_index)
    m0, m1, m2 = row0["memory"], row1["memory"], row2["memory"]
    slack = MEMORY_SLACK + size // 100
    d_nvml, d_cuda = m1["used"] - m0["used"], free0 - free1
    problems = []
    if abs(d_nvml - size) > slack:
        problems.append(f"NVML used grew {d_nvml / MiB:.0f} MiB for a {size / MiB:.0f} MiB allocation")
    if abs(d_cuda - size) > slack:
        problems.append(f"CUDA free fell {d_cuda / MiB:.0f} MiB for a {size / MiB:.0f} MiB allocation")
    if abs(m1["free"] - free1) > 0.02 * total:
        problems.append(f"NVML free {m1['free'] / MiB:.0f} MiB vs CUDA free {free1 / MiB:.0f} MiB")
    if abs(m2["used"] - m0["used"]) > slack:
        problems.append(f"after release NVML used is {(m2['used'] - m0['used']) / MiB:+.0f} MiB off the start")
    if direct1 and abs(direct1["used"] - m1["used"]) > slack:
        problems.append(f"plugin used {m1['used'] / MiB:.0f} MiB vs NVML {direct1['used'] / MiB:.0f} MiB")
    detail = (f"{size / MiB:.0f} MiB allocated: NVML used +{d_nvml / MiB:.0f} MiB, CUDA free -{d_cuda / MiB:.0f} MiB; "
              f"NVML free {m1['free'] / MiB:.0f} vs CUDA free {free1 / MiB:.0f} MiB of {total / MiB:.0f}")
    if problems:
        detail += "; " + "; ".join(problems)
    return verdict(not problems, detail, allocated_bytes=size, nvml_used_delta=d_nvml, cuda_free_delta=d_cuda,
                   nvml_before=m0, nvml_during=m1, nvml_after=m2, cuda_free_before=free0, cuda_free_during=free1,
                   cuda_total=total, slack_bytes=slack)
