"""Published DGX Spark decode figures (plan/published.json) against the uncalibrated planner.

Every figure carries its source, a quote of the figure and the inputs that describe the measured
setup.  The uncalibrated errors are printed per figure (pytest -s) and bounded per class; the bounds
are regression guards at the measured errors (docs/plan.md, "Cross-validation"), not the targets --
the overall median (10.8 %) and the worst figure (two-Spark Nemotron at c64, +73 %) miss the 10 % / 30 %
targets, which docs/plan.md says.
"""
from __future__ import annotations

from statistics import median

from vllm_spark_plugin.plan.published import evaluate, published_entries, table


def test_every_figure_is_sourced_quoted_and_described():
    for e in published_entries():
        assert e["source"].startswith("https://"), e["id"]
        assert e.get("quote"), e["id"]
        for k in ("model", "engine", "engine_key", "weight_format", "context", "tokens_per_second", "measure",
                  "concurrency", "tp"):
            assert k in e, (e["id"], k)


def test_figures_span_models_engines_layouts_and_options():
    es = published_entries()
    assert len({e["model"] for e in es}) >= 5 and len({e["source"] for e in es}) >= 6
    assert {"vllm", "llama.cpp", "trtllm"} <= {e["engine_key"] for e in es}
    assert {1, 2} <= {e["tp"] for e in es} and max(e["concurrency"] for e in es) >= 64
    assert any(e.get("spec") for e in es) and any(e.get("enforce_eager") for e in es)
    assert len({e["id"] for e in es}) == len(es)


def test_uncalibrated_errors_per_class():
    rows = evaluate()
    print()
    print(table(rows))
    errs = [abs(r["error"]) for r in rows]
    assert median(errs) <= 0.12
    for r in rows:
        if r["class"] in ("MoE c1", "eager", "other engines"):
            assert abs(r["error"]) <= 0.15, r
        elif r["class"] == "MoE c>1":
            assert abs(r["error"]) <= 0.35, r
        else:  # dense early kernel paths, speculative, two Sparks
            assert abs(r["error"]) <= 0.75, r
