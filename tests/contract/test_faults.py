"""Fault injection: nothing the plugin meets may raise into vLLM; each fault is counted.

The stats objects are vLLM's real classes.  NVML cannot run here (no GPU): it is replaced at the
narrowest seam, the `pynvml` module object handed to the sampler, by fakes that throw or that behave
like GB10 (memory queries NOT_SUPPORTED, energy counting up).
"""
from __future__ import annotations

import math
import types

import pytest
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

from vllm_spark_plugin.hooks import channel
from vllm_spark_plugin.hooks.stat_logger import SparkStatLogger
from vllm_spark_plugin.metrics.step import LAYOUT
from vllm_spark_plugin.metrics.telemetry import Hardware


def cfg(blocks=101, name="fault-model"):
    return types.SimpleNamespace(cache_config=types.SimpleNamespace(num_gpu_blocks=blocks),
                                 model_config=types.SimpleNamespace(served_model_name=name))


@pytest.fixture
def logger(fresh):
    return SparkStatLogger(cfg(), engine_index=0)


def good_step(logger, gen=5):
    i = IterationStats()
    i.num_generation_tokens = gen
    logger.record(SchedulerStats(num_running_reqs=2), i)


BROKEN = [
    ("missing attributes", object(), object()),
    ("None everywhere", SchedulerStats(num_running_reqs=None, num_waiting_reqs=None, kv_cache_usage=None), None),
    ("NaN", SchedulerStats(num_running_reqs=math.nan, kv_cache_usage=math.nan), None),
    ("negative", SchedulerStats(num_running_reqs=-3, num_waiting_reqs=-1, kv_cache_usage=-0.5), None),
    ("strings", SchedulerStats(num_running_reqs="4", kv_cache_usage="x"), None),
]


@pytest.mark.parametrize("what,sched,it", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_scheduler_stats_are_contained_and_counted(fresh, logger, what, sched, it):
    logger.record(sched, it)  # must not raise
    assert fresh.errors_total() > 0, what
    good_step(logger)  # serving continues: the next good step is recorded
    assert fresh.sample("vllm_spark_generation_tokens_total", model_name="fault-model", engine="0") == 5


def test_broken_hook_records_are_contained_and_counted(fresh, logger):
    """A scheduler-hook record with impossible values (a step of negative length, a negative batch)."""
    reader = channel.StepReader("/nonexistent", logger.record_step, logger.count_invalid, pytest.fail)
    reader.deliver(LAYOUT.pack(0, -5, -1, 0, 2, 2, -1, 0, -1, -1, -1, -1, -1))  # as the channel's thread hands it on
    assert fresh.errors_total() == 1
    assert fresh.sample("vllm_spark_step_duration_seconds_count", model_name="fault-model", engine="0") == 0
    reader.deliver(LAYOUT.pack(0, 20_000, 0, 0, 2, 2, 50, 101, -1, -1, -1, -1, -1))  # the next good record is recorded
    assert fresh.sample("vllm_spark_step_duration_seconds_count", model_name="fault-model", engine="0") == 1


def test_broken_request_stats(fresh, logger):
    i = IterationStats()
    i.time_to_first_tokens_iter = [math.nan, -1.0, None, 0.2]
    i.num_generation_tokens = -7
    i.finished_requests = [
        FinishedRequestStats(finish_reason=FinishReason.ABORT, num_generation_tokens=0, decode_time=0.0),  # zero tokens
        FinishedRequestStats(finish_reason=FinishReason.LENGTH, num_generation_tokens=None, decode_time=1.0),
        FinishedRequestStats(finish_reason=FinishReason.LENGTH, num_generation_tokens=10, decode_time=math.inf),
        FinishedRequestStats(finish_reason=FinishReason.LENGTH, num_generation_tokens=10, decode_time=-2.0),
    ]
    logger.record(None, i)
    assert fresh.errors_total() == 7  # 3 bad TTFTs, bad token count, 3 bad finished requests
    assert fresh.sample("vllm_spark_ttft_seconds_count", model_name="fault-model", engine="0") == 1
    for name in ("stream_decode_tokens_per_second_count", "engine_stream_decode_tokens_per_second_count"):
        assert fresh.sample("vllm_spark_" + name, model_name="fault-model", engine="0") == 0


class NvmlError(Exception):
    pass


class ThrowingNvml:
    """Every call raises (a driver in a bad state)."""

    def __getattr__(self, name):
        def boom(*a, **k):
            raise NvmlError(f"{name} failed")
        return boom


class OneGpu:
    """Initialises and lists one GPU."""

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i


class ReadingsThrowNvml(OneGpu, ThrowingNvml):
    """One GPU, then every reading raises."""


def test_nvml_that_throws_on_every_call(fresh):
    exp = fresh.exporter("fault-model")
    for _ in range(3):
        exp.hardware = Hardware(exp.ins, exp.settings.kernel_log)  # a fresh sampler each round
        exp.sample_hardware(nvml=ThrowingNvml())  # must not raise
    assert fresh.errors_total() > 0
    # memory still comes from /proc even when NVML is broken
    assert fresh.sample("vllm_spark_unified_memory_bytes", kind="total") > 0


def test_nvml_whose_readings_throw_keeps_sampling(fresh):
    exp = fresh.exporter("fault-model")
    exp.sample_hardware(nvml=ReadingsThrowNvml())
    before = fresh.errors_total()
    exp.sample_hardware(nvml=ReadingsThrowNvml())  # same sampler, second round
    assert fresh.errors_total() > before


class NotSupported(Exception):
    pass


NotSupported.__name__ = "NVMLError_NotSupported"


class Gb10Nvml(OneGpu):
    """GB10-like: power/energy/clock/temp work, memory info is NOT_SUPPORTED."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self):
        self.energy_mj = 5_000_000

    def nvmlDeviceGetPowerUsage(self, h):
        return 95_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy_mj += 95_000  # 95 J since the last reading
        return self.energy_mj

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 2400

    def nvmlDeviceGetTemperature(self, h, kind):
        return 61

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=87, memory=0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4  # sw power cap

    def nvmlDeviceGetMemoryInfo(self, h):
        raise NotSupported()


def test_gb10_like_nvml_energy_deltas_and_gauges(fresh):
    exp = fresh.exporter("gb10")
    sample = fresh.sample
    fake = Gb10Nvml()
    e0 = sample("vllm_spark_gpu_energy_joules_total", gpu="0")
    exp.sample_hardware(nvml=fake)   # first reading is the baseline
    exp.sample_hardware(nvml=fake)
    exp.sample_hardware(nvml=fake)
    assert sample("vllm_spark_gpu_energy_joules_total", gpu="0") - e0 == pytest.approx(190.0)
    assert sample("vllm_spark_gpu_power_watts", gpu="0") == 95.0
    assert sample("vllm_spark_gpu_sm_clock_hertz", gpu="0") == 2.4e9
    assert sample("vllm_spark_gpu_utilization_ratio", gpu="0") == pytest.approx(0.87)
    assert sample("vllm_spark_gpu_clock_event_active", gpu="0", reason="sw_power_cap") == 1
    assert sample("vllm_spark_gpu_clock_event_active", gpu="0", reason="hw_thermal_slowdown") == 0


def test_no_driver_is_not_an_error(fresh):
    class LibraryNotFound(Exception):
        pass
    LibraryNotFound.__name__ = "NVMLError_LibraryNotFound"

    class NoDriver:
        def nvmlInit(self):
            raise LibraryNotFound()

    exp = fresh.exporter("no-gpu")
    exp.sample_hardware(nvml=NoDriver())
    assert fresh.errors_total() == 0
