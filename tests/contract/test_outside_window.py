"""A vLLM that lacks what a feature needs (as a release outside the window does): the plugin loads,
says once which features are off and why, names them in `vllm_spark_info` and leaves vLLM alone.
The probes themselves run on real releases (test_vllm_port.py); here one is made to fail."""
from __future__ import annotations

import logging
import types

from vllm_spark_plugin.hooks import PATCHES, patching
from vllm_spark_plugin.hooks import scheduler as hook
from vllm_spark_plugin.hooks import stat_logger as sl
from vllm_spark_plugin.settings import Settings
from vllm_spark_plugin.vllm import capabilities

MODEL = "outside-window-model"


def missing(name):
    return lambda: capabilities.Capability(name, False, "LookupError: SchedulerOutput lacks scheduled_new_reqs")


def test_a_missing_piece_turns_one_feature_off_plainly(fresh, monkeypatch, caplog):
    monkeypatch.setitem(capabilities.PROBES, "step_hook", missing("step_hook"))
    monkeypatch.setattr(sl, "_announced", False)
    cfg = types.SimpleNamespace(cache_config=types.SimpleNamespace(num_gpu_blocks=101),
                                model_config=types.SimpleNamespace(served_model_name=MODEL))
    with caplog.at_level(logging.INFO, logger="vllm_spark_plugin"):
        logger = sl.SparkStatLogger(cfg, engine_index=0)
        sl.SparkStatLogger(cfg, engine_index=1)  # a second engine: no second announcement
    logger.exporter.stop_background()
    said = [r.getMessage() for r in caplog.records if "off:" in r.getMessage()]
    assert len(said) == 1 and "step_hook (LookupError: SchedulerOutput lacks scheduled_new_reqs)" in said[0]
    info = [lab for lab, v in fresh.values("vllm_spark_info", model_name=MODEL) if v == 1]
    assert len(info) == 1 and info[0]["features_off"] == "step_hook"
    assert logger.reader is None and not logger.exporter.hook_steps  # the batch comes from vLLM's running count
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats
    it = IterationStats()
    it.num_generation_tokens = 3
    logger.record(SchedulerStats(num_running_reqs=2), it)
    batches = fresh.sample("vllm_spark_step_batch_size_count", model_name=MODEL, engine="0")
    assert batches == 1


def test_the_engine_core_leaves_the_scheduler_unpatched(monkeypatch, caplog):
    monkeypatch.setitem(capabilities.PROBES, "step_hook", missing("step_hook"))
    monkeypatch.setattr(capabilities, "step_hook", missing("step_hook"))

    class Scheduler:
        def schedule(self):
            return "out"

        def update_from_output(self, so, mro):
            return {}

    module = types.SimpleNamespace(Scheduler=Scheduler)
    monkeypatch.setitem(__import__("sys").modules, capabilities.SCHEDULER_MODULE, module)
    errs = []
    with caplog.at_level(logging.WARNING, logger="vllm_spark_plugin"):
        hook.install(next(p for p in PATCHES if p.name == hook.PATCH), Settings(), lambda where, exc: errs.append(where))
    assert errs == [] and not patching.marked(Scheduler, hook.PATCH)
    assert Scheduler().schedule() == "out"
    assert any("per-step hook off in this engine core" in r.getMessage() for r in caplog.records)
