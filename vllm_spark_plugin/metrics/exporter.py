"""Per-process exporter state: labelled instrument children, the online knee estimators, and the
background thread that samples hardware and refreshes the knee gauges off the hot path.
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import threading
import time

from vllm_spark_plugin import __version__
from vllm_spark_plugin import settings as settings_mod
from vllm_spark_plugin import slo_settings
from vllm_spark_plugin.definitions import SLO_OUTCOMES, slo_outcome
from vllm_spark_plugin.metrics import errors, instruments
from vllm_spark_plugin.metrics.derive import DerivedStep

log = logging.getLogger("vllm_spark_plugin")


TOO_FEW = "too few points"
VERDICTS = ("ok", "no knee in the measured range", "retrograde", TOO_FEW, "no spread", "invalid input")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _fmt_floor(f: float) -> str:
    return f"{f:g}"


class EngineChildren:
    """Labelled children cached once: `.labels()` costs ~2 us per call on the hot path."""

    def __init__(self, ins: instruments.Instruments, model: str, engine: str,
                 floors: tuple[float, ...] = slo_settings.DEFAULT_FLOORS) -> None:
        lv = (model, engine)
        self.step_batch = ins.step_batch.labels(*lv)
        self.step_prefill = ins.step_tokens.labels(*lv, "prefill")
        self.step_decode = ins.step_tokens.labels(*lv, "decode")
        self.step_duration = ins.step_duration.labels(*lv)
        self.kv_used = ins.kv_used.labels(*lv)
        self.kv_total = ins.kv_total.labels(*lv)
        self.running = ins.running.labels(*lv)
        self.waiting = ins.waiting.labels(*lv)
        self.preemptions = ins.preemptions.labels(*lv)
        self.ttft = ins.ttft.labels(*lv)
        self.stream_rate = ins.stream_rate.labels(*lv)
        self.engine_stream_rate = ins.engine_stream_rate.labels(*lv)
        self.generation_tokens = ins.generation_tokens.labels(*lv)
        self.prompt_tokens = ins.prompt_tokens.labels(*lv)
        self._finished = ins.finished
        self._lv = lv
        self._finished_children: dict = {}
        self.invalid = ins.errors.labels(where="invalid_stats")
        # latency SLO, per floor: (floor, {outcome: requests child}, {outcome: tokens child}); every
        # outcome's series exists from the start, so attainment is defined as soon as requests finish
        self.slo = tuple((f, {o: ins.slo_requests.labels(*lv, _fmt_floor(f), o) for o in SLO_OUTCOMES},
                          {o: ins.slo_tokens.labels(*lv, _fmt_floor(f), o) for o in SLO_OUTCOMES}) for f in floors)
        self.spare = tuple(ins.spare_capacity.labels(*lv, _fmt_floor(f)) for f in floors)

    def finished(self, reason: str):
        c = self._finished_children.get(reason)
        if c is None:
            c = self._finished_children[reason] = self._finished.labels(*self._lv, reason)
        return c


class EngineState:
    def __init__(self, exporter: "Exporter", engine: str) -> None:
        self.engine = engine
        self.floors = exporter.slo.floors
        self.ttft_slo = exporter.slo.ttft_slo_seconds
        self.exporter = exporter
        self.children = EngineChildren(exporter.ins, exporter.model, engine, self.floors)
        exporter.ins.ttft_slo.labels(exporter.model, engine).set(self.ttft_slo)
        self.knee = exporter.new_estimator()
        self.batch_sum = 0
        self.batch_n = 0
        # capacity under both SLOs per floor (set by the refit) and the running count it is spared from
        self.slo_capacity: tuple = (None,) * len(self.floors)
        self.running_now: int | None = None
        # gauges are set only when their value changes (a set takes a lock; most steps change nothing),
        # except with several API servers, where the most recent write of any process is the value
        self.kv_used_now: int | None = None
        self.waiting_now: int | None = None
        self.rewrite = "PROMETHEUS_MULTIPROC_DIR" in os.environ

    def record(self, d: DerivedStep) -> None:
        c = self.children
        if d.invalid:
            c.invalid.inc(d.invalid)
        if d.batch is not None and d.count_batch and (d.batch > 0 or d.step_seconds is not None):
            if d.batch > 0:
                c.step_batch.observe(d.batch)
            self.batch_sum += d.batch
            self.batch_n += 1
        if d.step_seconds is not None:
            c.step_duration.observe(d.step_seconds)
            if d.prefill_tokens:
                c.step_prefill.observe(d.prefill_tokens)
            if d.decode_tokens:
                c.step_decode.observe(d.decode_tokens)
            if self.knee is not None and d.batch:
                self.knee.observe(d.batch, d.prefill_tokens or 0, d.step_seconds, d.tokens_per_stream)
        if d.kv_used is not None and (d.kv_used != self.kv_used_now or self.rewrite):
            self.kv_used_now = d.kv_used
            c.kv_used.set(d.kv_used)
        if d.running is not None and (d.running != self.running_now or self.rewrite):
            c.running.set(d.running)
            if d.running != self.running_now:
                self.running_now = d.running
                self.publish_spare()
        if d.waiting is not None and (d.waiting != self.waiting_now or self.rewrite):
            self.waiting_now = d.waiting
            c.waiting.set(d.waiting)
        if d.generation_tokens:
            c.generation_tokens.inc(d.generation_tokens)
        if d.prompt_tokens:
            c.prompt_tokens.inc(d.prompt_tokens)
        if d.preempted:
            c.preemptions.inc(d.preempted)
        for t in d.ttfts:
            c.ttft.observe(t)
            if self.knee is not None and d.batch:
                self.knee.observe_ttft(d.batch, t)
        # per-stream rates and the SLO: on the delivery clock where the API server times hand-offs
        # (`record_delivered`), else on the engine core's clock
        delivery = self.exporter.delivery_clock
        for r in d.stream_rates:
            c.engine_stream_rate.observe(r)
            if not delivery:
                c.stream_rate.observe(r)
        for reason in d.finished_reasons:
            c.finished(reason).inc()
        if d.finished_slo and not delivery:
            self.record_slo(d.finished_slo)

    def record_delivered(self, d) -> None:
        """One finished request on the delivery clock (`metrics.delivery.Delivered`)."""
        if d.streamed and d.decode_rate is not None:
            self.children.stream_rate.observe(d.decode_rate)
        self.record_slo(((d.ttft, d.decode_rate, d.output_tokens),))

    def record_hook_step(self, batch: int, step_seconds: float, prefill_tokens: int, decode_tokens: int,
                         kv_used: int | None, tokens_per_stream: float) -> None:
        """One scheduler-hook step (validated by the caller): the lean path of `record`."""
        c = self.children
        if batch > 0:
            c.step_batch.observe(batch)
        self.batch_sum += batch
        self.batch_n += 1
        c.step_duration.observe(step_seconds)
        if prefill_tokens:
            c.step_prefill.observe(prefill_tokens)
        if decode_tokens:
            c.step_decode.observe(decode_tokens)
        if self.knee is not None and batch:
            self.knee.observe(batch, prefill_tokens, step_seconds, tokens_per_stream)
        if kv_used is not None and (kv_used != self.kv_used_now or self.rewrite):
            self.kv_used_now = kv_used
            c.kv_used.set(kv_used)

    def record_slo(self, finished) -> None:
        """Count each finished request (TTFT, rate, tokens) under its SLO outcome at every floor."""
        ttft_slo = self.ttft_slo
        for ttft, rate, tokens in finished:
            for floor, requests, out_tokens in self.children.slo:
                o = slo_outcome(ttft, rate, ttft_slo, floor)
                requests[o].inc()
                if tokens:
                    out_tokens[o].inc(tokens)

    def publish_spare(self) -> None:
        """Spare capacity per floor = capacity under both SLOs - running streams (negative: overloaded)."""
        running = self.running_now
        if running is None:
            return
        for cap, child in zip(self.slo_capacity, self.children.spare):
            if cap is not None:
                child.set(cap - running)

    def take_mean_batch(self) -> float:
        n, s = self.batch_n, self.batch_sum
        self.batch_n = 0
        self.batch_sum = 0
        return s / n if n else 0.0


class Exporter:
    def __init__(self, model: str, settings: settings_mod.Settings | None = None, registry=None) -> None:
        """`registry`: a prometheus-client registry of its own (tests); default the process's, which
        vLLM's /metrics serves."""
        self.settings = settings or settings_mod.current()
        self.slo = slo_settings.from_settings(self.settings)
        self.model = model
        self.ins = instruments.get() if registry is None else instruments.Instruments(registry)
        self.engines: dict[int, EngineState] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._hw = None
        self._mem = None   # memory_telemetry.MemoryTelemetry, created on the telemetry thread
        self._hw_leader = None
        self.total_blocks: int | None = None
        self._profile_mtime: float | None = None
        self._read_spilled = None
        self._absorbed: dict = {}  # (pid, where) -> other processes' errors already counted
        # True once `hooks.delivery` times this process's streams: per-stream rates and the SLO come
        # from there, the stat logger's engine-clock rates go to their own histogram only
        self.delivery_clock = False

    # -- engines ----------------------------------------------------------------------------------
    def new_estimator(self):
        try:
            from vllm_spark_plugin.knee.online import OnlineKneeEstimator
            return OnlineKneeEstimator.from_settings(self.settings)
        except Exception as exc:
            errors.report("knee_init", exc)
            return None

    def engine(self, idx: int) -> EngineState:
        st = self.engines.get(idx)
        if st is None:
            with self._lock:
                st = self.engines.get(idx)
                if st is None:
                    st = self.engines[idx] = EngineState(self, str(idx))
                    self.publish_verdict((self.model, st.engine), TOO_FEW)  # on /metrics from the first scrape
                    self.ins.fit_samples.labels(self.model, st.engine).set(0)
                    if self.total_blocks:
                        st.children.kv_total.set(self.total_blocks)
        return st

    def set_total_blocks(self, total: int | None) -> None:
        if total:
            self.total_blocks = total
            for st in self.engines.values():
                st.children.kv_total.set(total)

    # -- static series ----------------------------------------------------------------------------
    def set_info(self, vllm_version: str, device: str, moe_backend: str, features_off: str = "none") -> None:
        info = self.ins.info
        for labels in list(getattr(info, "_metrics", {})):  # one info series: drop an earlier label set
            if labels[4] == self.model:
                info.remove(*labels)
        info.labels(__version__, vllm_version, device, moe_backend or "none", self.model, features_off).set(1)

    def absorb_errors_from(self, read_spilled) -> None:
        """Errors contained in processes without an exporter (engine core, workers) are added to
        this process's count by the telemetry thread: `read_spilled()` -> {pid: {where: total}}."""
        self._read_spilled = read_spilled

    def watch_profile(self) -> None:
        """(Re)load the offline profile when its file appears or changes (a sweep can rewrite it)."""
        path = self.settings.profile
        if not path:
            return
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            return  # not written yet
        if mtime != self._profile_mtime:
            self._profile_mtime = mtime
            self.load_profile(path)

    def load_profile(self, path: str) -> bool:
        """Offline capacity profile (written by `vllm-spark bench`) shown beside the live knee."""
        try:
            with open(path, encoding="utf-8") as fh:
                prof = json.load(fh)
            knee = prof.get("knee")
            plateau = prof.get("plateau_tokens_per_second")
            if _finite(knee):
                self.ins.profile_knee.labels(self.model).set(knee)
            if _finite(plateau):
                self.ins.profile_max.labels(self.model).set(plateau)
            for floor, streams in (prof.get("capacity") or {}).items():
                if _finite(streams):
                    self.ins.profile_capacity.labels(self.model, _fmt_floor(float(floor))).set(streams)
            return True
        except Exception as exc:
            errors.report("profile", exc)
            return False

    # -- background work --------------------------------------------------------------------------
    def start_background(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="vllm-spark-telemetry", daemon=True)
        self._thread.start()

    def stop_background(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        period = self.settings.hardware_interval_seconds
        next_knee = 0.0
        while not self._stop.is_set():
            try:
                self.sample_hardware()
            except Exception as exc:
                errors.report("hardware", exc)
            try:
                self.watch_profile()
            except Exception as exc:
                errors.report("profile", exc)
            if self._read_spilled is not None and self._is_hw_leader():
                try:
                    errors.absorb(self._read_spilled(), self._absorbed)
                except Exception as exc:
                    errors.report("absorb_errors", exc)
            now = time.monotonic()
            if now >= next_knee:
                next_knee = now + self.settings.knee_refit_seconds
                try:
                    self.refresh_knee()
                except Exception as exc:
                    errors.report("knee", exc)
            self._stop.wait(period)

    def _is_hw_leader(self) -> bool:
        """Only one process samples hardware, or N API servers would count energy N times."""
        if self._hw_leader is not None:
            return self._hw_leader
        d = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not d:
            self._hw_leader = True
            return True
        try:
            self._lock_fh = open(os.path.join(d, "vllm_spark_hardware.lock"), "w")
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._hw_leader = True
        except OSError:
            self._hw_leader = False
        return self._hw_leader

    def sample_hardware(self, nvml=None) -> None:
        from vllm_spark_plugin.metrics import hardware
        if not self._is_hw_leader():
            return
        ins = self.ins
        if self._mem is None:
            from vllm_spark_plugin.metrics.memory_telemetry import MemoryTelemetry
            self._mem = MemoryTelemetry(ins)
        self._mem.sample()  # /proc/meminfo, /proc/pressure/memory, kernel log (NVRM events); never raises
        if self._hw is None:
            self._hw = hardware.NvmlSampler(nvml)
            self._hw.init()
        if not self._hw.available:
            self._mem.sample_gpu_memory(None)
            return
        rows = self._hw.sample()
        self._mem.sample_gpu_memory(rows)
        for r in rows:
            g = r["gpu"]
            if "energy_delta_j" in r:
                ins.energy.labels(g).inc(r["energy_delta_j"])  # 0 on the first reading: the series exists
            if "power_w" in r:
                ins.power.labels(g).set(r["power_w"])
            if "sm_clock_hz" in r:
                ins.sm_clock.labels(g).set(r["sm_clock_hz"])
            if "temperature_c" in r:
                ins.temperature.labels(g).set(r["temperature_c"])
            if "utilization" in r:
                ins.utilization.labels(g).set(r["utilization"])
            for reason, active in r.get("reasons", {}).items():
                ins.clock_event.labels(g, reason).set(active)

    def publish_verdict(self, lv: tuple, verdict: str) -> None:
        for v in VERDICTS:
            self.ins.verdict.labels(*lv, v).set(1 if v == verdict else 0)

    def refresh_knee(self) -> None:
        """Refit each engine's step-time model and set the knee gauges (never NaN or infinite)."""
        ins = self.ins
        for st in list(self.engines.values()):
            mean_batch = st.take_mean_batch()
            if st.knee is None:
                continue
            res = st.knee.estimate(force=True)  # the telemetry loop's timer is the one throttle
            lv = (self.model, st.engine)
            self.publish_slo_capacity(st, res)
            n = getattr(res, "n", None) if res is not None else None
            ins.fit_samples.labels(*lv).set(n if _finite(n) else 0)
            self.publish_verdict(lv, str(getattr(res, "verdict", "unknown")) if res is not None else TOO_FEW)
            if res is None:
                continue
            knee = getattr(res, "knee", None)
            for gauge, value in ((ins.knee, knee), (ins.max_throughput, getattr(res, "plateau_tokens_per_second", None)),
                                 (ins.alpha, getattr(res, "alpha_seconds", None)), (ins.beta, getattr(res, "beta_seconds", None)),
                                 (ins.fit_r2, getattr(res, "r2", None))):
                if _finite(value):
                    gauge.labels(*lv).set(value)
            for floor, streams in (getattr(res, "capacity", None) or {}).items():
                if _finite(streams):
                    ins.capacity.labels(*lv, _fmt_floor(float(floor))).set(streams)
            if _finite(knee) and knee > 0:
                ins.knee_ratio.labels(*lv).set(mean_batch / knee)

    def publish_slo_capacity(self, st: EngineState, res) -> None:
        """TTFT capacity and its verdict, capacity under both SLOs per floor, and the spare capacity."""
        from vllm_spark_plugin.knee.result import floor_key
        from vllm_spark_plugin.knee.slo_capacity import VERDICTS, capacity_under_both

        ins = self.ins
        lv = (self.model, st.engine)
        ttft = st.knee.ttft_capacity()
        if ttft.streams is not None:
            ins.capacity_ttft.labels(*lv).set(ttft.streams)
        for v in VERDICTS:
            ins.capacity_ttft_verdict.labels(*lv, v).set(1 if v == ttft.verdict else 0)
        floor_caps = getattr(res, "capacity", None) or {}
        caps = []
        for f in st.floors:
            fc = floor_caps.get(floor_key(f))
            cap = capacity_under_both(fc if _finite(fc) else None, ttft)
            caps.append(cap)
            if cap is not None:
                ins.slo_capacity.labels(*lv, _fmt_floor(f)).set(cap)
        st.slo_capacity = tuple(caps)
        st.publish_spare()


_exporters: dict[str, Exporter] = {}
_exporter_lock = threading.Lock()


def get(model: str) -> Exporter:
    """The process's exporter for `model` (vLLM serves one model per process; tests make several)."""
    with _exporter_lock:
        exp = _exporters.get(model)
        if exp is None:
            exp = _exporters[model] = Exporter(model)
        return exp
