"""The knee verdict is on /metrics from the first scrape, and each refit replaces it."""
from __future__ import annotations

import types

from vllm_spark_plugin.hooks.stat_logger import SparkStatLogger
from vllm_spark_plugin.metrics.step import HookStep

MODEL = "first-scrape-model"


def test_too_few_points_before_the_first_fit_then_the_refit_verdict(fresh):
    def verdicts() -> dict:
        return {lab["verdict"]: v for lab, v in fresh.values("vllm_spark_knee_verdict", model_name=MODEL)}

    cfg = types.SimpleNamespace(cache_config=types.SimpleNamespace(num_gpu_blocks=101),
                                model_config=types.SimpleNamespace(served_model_name=MODEL))
    logger = SparkStatLogger(cfg, engine_index=0)
    logger.exporter.stop_background()
    assert verdicts()["too few points"] == 1 and sum(verdicts().values()) == 1  # before any step
    exp = logger.exporter
    exp.refresh_knee()  # a refit with no step yet keeps saying so
    assert verdicts()["too few points"] == 1
    for i in range(600):  # steps of t = 20 ms + 1 ms per stream, batches 1..32
        b = 1 + i % 32
        logger.record_step(HookStep(0, 20_000 + 1_000 * b, 0, 0, b, b, 50, 101, -1))
    exp.refresh_knee()
    v = verdicts()
    assert sum(v.values()) == 1 and v["too few points"] == 0, v
    assert v["ok"] == 1, v
    knee = fresh.sample("vllm_spark_knee_batch_size", model_name=MODEL, engine="0")
    assert abs(knee - 20.0) < 1.0  # alpha / beta = 20 ms / 1 ms
