"""Every assumption of the vLLM port, checked against the installed vLLM's real classes (no server).

Run under each release's environment by `scripts/release-matrix.sh` (the CUDA build of a release
without a CPU build imports here without a GPU): a release is in the window when this file passes.
"""
from __future__ import annotations

import dataclasses
import pickle
import types

import pytest

from vllm_spark_plugin.hooks import scheduler as hook
from vllm_spark_plugin.hooks import stats
from vllm_spark_plugin.vllm import capabilities, platform



@pytest.mark.parametrize("name", list(capabilities.PROBES))
def test_every_feature_is_offered_by_the_installed_release(name):
    cap = capabilities.PROBES[name]()
    assert capabilities.in_window(), f"vLLM {platform.vllm_version()} is outside {capabilities.window_text()}"
    assert cap.ok, str(cap)


def test_the_stat_logger_entry_point_loads_through_vllms_own_loader():
    from vllm.v1.metrics import loggers

    from vllm_spark_plugin.hooks.stat_logger import SparkStatLogger
    load = getattr(loggers, "load_stat_logger_plugin_factories", None)
    if load is None:  # older releases resolve the group elsewhere; the group itself is probed above
        from vllm.plugins import load_plugins_by_group
        found = load_plugins_by_group(capabilities.STAT_LOGGER_GROUP).values()
    else:
        found = load()
    assert SparkStatLogger in list(found)
    assert issubclass(SparkStatLogger, loggers.StatLoggerBase)


def test_stats_read_every_field_of_real_stats_objects():
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

    it = IterationStats()
    it.num_generation_tokens = 5
    it.time_to_first_tokens_iter = [0.1]
    names = {f.name for f in dataclasses.fields(FinishedRequestStats)}
    kw = {k: v for k, v in dict(finish_reason=FinishReason.LENGTH, num_generation_tokens=9, decode_time=0.4,
                                 num_prompt_tokens=7).items() if k in names}
    it.finished_requests = [FinishedRequestStats(**kw)]
    s = stats.read(SchedulerStats(num_running_reqs=3, num_waiting_reqs=1, kv_cache_usage=0.5), it)
    assert s.missing == 0
    assert (s.running, s.waiting, s.kv_usage) == (3, 1, 0.5)
    assert s.generation_tokens == 5 and s.ttfts == [0.1]
    assert (s.finished[0].generation_tokens, s.finished[0].decode_seconds, s.finished[0].reason) == (9, 0.4, "length")


def _scheduler_output(new: dict[str, int], cached: dict[str, tuple[int, int]]):
    """A real SchedulerOutput: `new` req -> tokens; `cached` req -> (tokens, output tokens so far)."""
    from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
    so = SchedulerOutput.make_empty()
    so.scheduled_new_reqs = [types.SimpleNamespace(req_id=r) for r in new]
    cr = CachedRequestData.make_empty()
    cr.req_ids = list(cached)
    if hasattr(cr, "num_output_tokens"):
        cr.num_output_tokens = [n_out for _, n_out in cached.values()]
    so.scheduled_cached_reqs = cr
    so.num_scheduled_tokens = {**new, **{r: t for r, (t, _) in cached.items()}}
    so.total_num_scheduled_tokens = sum(so.num_scheduled_tokens.values())
    return so


def test_step_composition_from_a_real_scheduler_output():
    so = _scheduler_output({"a": 100}, {"b": (1, 5), "c": (1, 9), "d": (64, 0)})
    pre_reqs, pre_tokens, dec_reqs, dec_tokens = hook.composition(so)
    from vllm.v1.core.sched.output import CachedRequestData
    chunked_seen = "num_output_tokens" in {f.name for f in dataclasses.fields(CachedRequestData)}
    # "d" is a continuing chunked prefill (no output token yet) where the release says so
    assert (pre_reqs, pre_tokens) == ((2, 164) if chunked_seen else (1, 100))
    assert pre_reqs + dec_reqs == 4 and pre_tokens + dec_tokens == 166


def test_the_hook_wraps_the_real_scheduler_and_sends_each_step(tmp_path, monkeypatch):
    """The real Scheduler class, patched on a subclass; steps driven with real SchedulerOutputs."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_spark_plugin.hooks import channel
    monkeypatch.setenv(channel.RUN_DIR_ENV, str(tmp_path))
    got, errs = [], []
    reader = channel.StepReader(str(tmp_path), got.append, lambda f: errs.append(("invalid", f)),
                                lambda w, e: errs.append((w, e)))
    assert reader.start()
    outputs = iter([_scheduler_output({"a": 100}, {}), _scheduler_output({}, {"a": (1, 1)})])

    class Pool:
        num_gpu_blocks = 101

        def get_num_free_blocks(self):
            return 90

    class Probe(Scheduler):
        def __init__(self):  # no engine: only the methods the hook wraps
            self.kv_cache_manager = types.SimpleNamespace(block_pool=Pool())
            self.running, self.waiting = [object()], []

        def schedule(self, *a, **k):
            return next(outputs)

        def update_from_output(self, scheduler_output, model_runner_output):
            return {}

        def get_num_unfinished_requests(self):
            return len(self.running) + len(self.waiting)

    hook.patch_scheduler(Probe, lambda where, exc: errs.append((where, exc)))
    sched = Probe()
    for last in (False, True):
        if last:
            sched.running = []  # the engine goes idle: the batch is flushed at once
        sched.update_from_output(sched.schedule(), None)
    import time
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    reader.stop()
    assert errs == []
    assert [g[2:8] for g in got] == [(1, 100, 0, 0, 90, 101), (0, 0, 1, 1, 90, 101)]
    assert all(g[1] >= 0 for g in got)
    assert callable(getattr(Scheduler, "get_num_unfinished_requests", None))  # what the hook asks when idle


def test_nvfp4_config_registers_and_claims_modelopt_nvfp4():
    from vllm.model_executor.layers.quantization import get_quantization_config

    from vllm_spark_plugin import settings
    from vllm_spark_plugin.hooks import PATCHES, nvfp4_claim
    patch = next(p for p in PATCHES if p.name == "nvfp4_claim")
    assert nvfp4_claim.install(patch, settings.Settings(), lambda where, exc: pytest.fail(f"{where}: {exc}"))
    assert nvfp4_claim.STATE["registered"]
    claim = get_quantization_config(nvfp4_claim.SPARK_NVFP4)
    cfg = {"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    assert claim.override_quantization_method(cfg, None) == nvfp4_claim.SPARK_NVFP4  # no CUDA here
    assert claim.override_quantization_method(cfg, "modelopt_fp4") is None  # the user named vLLM's


def test_nvfp4_methods_are_ordinary_classes_that_pickle():
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config, ModelOptNvFp4FusedMoE

    from vllm_spark_plugin.hooks import nvfp4_methods as m
    assert issubclass(m.SparkNvFp4Config, ModelOptNvFp4Config)
    assert issubclass(m.SparkModelOptNvFp4FusedMoE, ModelOptNvFp4FusedMoE)
    assert issubclass(m.SparkModelOptNvFp4ReferenceMoE, m.UnquantizedFusedMoEMethod)
    cfg = m.SparkNvFp4Config.from_config({"quant_method": "modelopt",
                                          "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                           "kv_cache_quant_algo": None,
                                                           "exclude_modules": ["lm_head"]}})
    again = pickle.loads(pickle.dumps(cfg))  # the engine and worker processes get it pickled
    assert type(again) is m.SparkNvFp4Config and again.get_name() == m.MODELOPT_FP4


def test_moe_backend_names_map_through_vllms_oracle():
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    from vllm_spark_plugin.moe import policy
    unknown = []
    for name in policy.SM12X_PREFERENCE:
        try:
            assert oracle.map_nvfp4_backend(name) is not None, name
        except ValueError as exc:  # a backend this release does not have (b12x before 0.29)
            assert repr(name) in str(exc)
            unknown.append(name)
    assert "marlin" not in unknown and "flashinfer_cutlass" not in unknown
    assert set(unknown) <= {"b12x"}, unknown  # the policy asks vLLM's availability, which says why


def test_the_startup_snapshot_wraps_the_real_executor_before_its_workers(monkeypatch):
    """The hook's target (Executor.__init__(vllm_config), which builds the workers through
    _init_executor, where vLLM's own free-memory check runs) on this release's real class."""
    import inspect

    from vllm.config import CacheConfig
    from vllm.v1.executor.abstract import Executor

    from vllm_spark_plugin.hooks import startup
    assert list(inspect.signature(Executor.__init__).parameters)[:2] == ["self", "vllm_config"]
    assert "gpu_memory_utilization" in {f.name for f in dataclasses.fields(CacheConfig)}
    monkeypatch.setattr(Executor, "__init__", Executor.__init__)  # restored after the test
    monkeypatch.setattr(Executor, "_vllm_spark_" + startup.PATCH, False, raising=False)  # patching.mark's marker
    order = []

    class Probe(Executor):
        def _init_executor(self):
            order.append("workers")

        def check_health(self):
            pass

        def collective_rpc(self, *args, **kwargs):
            pass

    Probe.__abstractmethods__ = frozenset()  # whatever else a release declares abstract is not called here
    errors = []
    startup.patch_executor(Executor, lambda where, exc: errors.append((where, exc)))
    monkeypatch.setattr(startup, "log_snapshot", lambda cfg: order.append("snapshot"))

    class AnyConfig:  # Executor.__init__ only copies sub-configs before building the workers
        def __getattr__(self, name):
            return None

    Probe(AnyConfig())
    assert order[:2] == ["snapshot", "workers"] and errors == []
