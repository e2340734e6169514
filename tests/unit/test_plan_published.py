"""Published DGX Spark decode figures (plan/published.json) against the uncalibrated planner.

What is asserted is only what is honest: every entry carries a source and the inputs that describe
the measured configuration, and every uncalibrated prediction lands within a generous stated bound
(+-35 %; the vLLM single-Spark rows within +-20 %).  The table of errors is printed (pytest -s).
"""
from __future__ import annotations

from vllm_spark_plugin.plan.published import evaluate, published_entries, table

BOUND_ALL = 0.35
BOUND_VLLM_SOLO = 0.20


def test_entries_have_sources_and_inputs():
    entries = published_entries()
    models = {e["model"] for e in entries}
    assert len(entries) >= 3 and len(models) >= 3
    for e in entries:
        assert e["source"].startswith("https://"), e["id"]
        for k in ("model", "engine", "weight_format", "context", "tokens_per_second", "measure"):
            assert k in e, (e["id"], k)
    assert "Qwen3.6-35B-A3B" not in models  # the seed model is tested separately


def test_uncalibrated_predictions_within_stated_bounds():
    rows = evaluate()
    print()
    print(table(rows))
    for r in rows:
        assert abs(r["error"]) <= BOUND_ALL, r
        if r["engine"].startswith("vLLM") and r["tp"] == 1:
            assert abs(r["error"]) <= BOUND_VLLM_SOLO, r
