"""The SLO guard's setting, step record and gauges (no vLLM: the scheduler side is
tests/contract/test_guard_scheduler.py)."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from vllm_spark_plugin.hooks import PATCHES, PLUGIN_LOAD, registration
from vllm_spark_plugin.metrics import names
from vllm_spark_plugin.metrics.exporter import Exporter
from vllm_spark_plugin.metrics.step import LAYOUT, NOT_COUNTED, HookStep
from vllm_spark_plugin.settings import Settings, load

GUARD = next(p for p in PATCHES if p.name == "guard")


def test_the_guard_is_off_by_default_and_its_patch_is_not_installed():
    s = load({}, announce=False)
    assert s.guard == "off" and not s.guard_on and not s.problems
    assert not registration.applies(GUARD, PLUGIN_LOAD, s, "engine_core")


def test_each_mode_parses_and_switches_the_patch_on():
    for mode in ("admission", "prefill", "both", " Both "):
        s = load({"SPARK_PLUGIN_GUARD": mode}, announce=False)
        assert s.guard == mode.strip().lower() and not s.problems
        assert registration.applies(GUARD, PLUGIN_LOAD, s, "engine_core")
    assert load({"SPARK_PLUGIN_GUARD": "0"}, announce=False).guard == "off"


def test_an_unknown_mode_is_one_line_naming_the_key_and_the_fix_and_the_guard_stays_off():
    s = load({"SPARK_PLUGIN_GUARD": "always"}, announce=False)
    assert s.guard == "off" and not registration.applies(GUARD, PLUGIN_LOAD, s, "engine_core")
    assert len(s.problems) == 1
    line = s.problems[0]
    assert "SPARK_PLUGIN_GUARD" in line and "off, admission, prefill, both" in line


def test_the_guard_patch_is_engine_core_side_and_probed():
    assert GUARD.kind == "wrap" and GUARD.probe == "guard" and GUARD.setting == "guard_on"
    assert GUARD.install == "vllm_spark_plugin.hooks.guard:install"


def test_a_step_without_the_guard_has_its_fields_not_counted_and_round_trips():
    old = HookStep(0, 1000, 1, 10, 3, 3, 50, 100, NOT_COUNTED)  # the record as the hook builds it guard off
    assert (old.guard_limit, old.guard_held, old.guard_budget, old.guard_wait_us) == (NOT_COUNTED,) * 4
    on = old._replace(guard_limit=8, guard_held=3, guard_budget=512, guard_wait_us=1_500_000)
    assert HookStep.from_wire(LAYOUT.unpack(on.pack())) == on


def _values(registry, model):
    def value(name, **labels):
        return registry.get_sample_value(name, {"model_name": model, "engine": "0", **labels})
    return value


def test_the_gauges_are_absent_while_off_set_while_on_and_removed_when_the_verdict_goes():
    model, registry = "unit-guard", CollectorRegistry()
    st = Exporter(model, Settings(), registry=registry, hook_steps=True).engine(0)
    value = _values(registry, model)
    base = HookStep(0, 20_000, 0, 0, 4, 4, 50, 100, NOT_COUNTED)
    st.record_step(base)
    assert value(names.GUARD_ADMISSION_LIMIT) is None and value(names.GUARD_PREFILL_BUDGET) is None
    assert value(names.GUARD_DEFERRED) is None and value(names.GUARD_DEFERRED_SECONDS + "_count") is None
    st.record_step(base._replace(guard_limit=6, guard_held=2, guard_budget=300, guard_wait_us=2_000_000))
    st.record_step(base._replace(guard_limit=6, guard_held=0, guard_budget=300, guard_wait_us=500_000))
    assert value(names.GUARD_ADMISSION_LIMIT) == 6 and value(names.GUARD_DEFERRED) == 0
    assert value(names.GUARD_PREFILL_BUDGET) == 300
    assert value(names.GUARD_DEFERRED_SECONDS + "_count") == 2
    assert value(names.GUARD_DEFERRED_SECONDS + "_sum") == 2.5
    st.record_step(base._replace(guard_held=0))  # no usable fit any more: no cap, no budget
    assert value(names.GUARD_ADMISSION_LIMIT) is None and value(names.GUARD_PREFILL_BUDGET) is None
    assert value(names.GUARD_DEFERRED) == 0


def test_the_delivery_feedback_reaches_the_engine_core_through_the_run_directory(tmp_path, monkeypatch):
    """The API server writes the 90th percentile of delivered over engine seconds per token; the engine
    core reads it once per change, at most once a period; a bad file is counted, never raised."""
    from vllm_spark_plugin.common import errors
    from vllm_spark_plugin.metrics.delivery import FEEDBACK_FILE, FeedbackReader, FeedbackWriter
    counted = []
    monkeypatch.setattr(errors, "report", lambda where, exc: counted.append(where))
    now = [0.0]
    w = FeedbackWriter(str(tmp_path), every=5.0, clock=lambda: now[0])
    r = FeedbackReader(str(tmp_path), every=10.0, clock=lambda: now[0])
    assert r.poll() is None                                   # nothing written yet
    for _ in range(20):
        w.add(20.0, 25.0)                                     # the client sees 20 tok/s, the engine 25
    now[0] = 6.0
    w.add(20.0, 25.0)
    assert (tmp_path / FEEDBACK_FILE).exists() and not list(tmp_path.glob("*.tmp"))
    now[0] = 10.0
    assert r.poll() == pytest.approx(1.25)
    now[0] = 15.0
    assert r.poll() is None                                   # within the period: no read
    now[0] = 20.0
    assert r.poll() is None                                   # unchanged file: nothing new
    (tmp_path / FEEDBACK_FILE).write_text("not a number\n")
    import os
    os.utime(tmp_path / FEEDBACK_FILE, ns=(1, 1))             # a change the reader sees
    now[0] = 40.0
    assert r.poll() is None and counted == ["guard_feedback"]


def test_the_loop_prior_comes_from_a_capacity_profile_or_a_slow_start_is_said(tmp_path):
    import json

    from vllm_spark_plugin.guard import prior
    path = tmp_path / "capacity_profile.json"
    path.write_text(json.dumps({"alpha_seconds": 0.022, "beta_seconds": 0.0012}))
    line, said = prior.from_profile(str(path))
    assert line == (0.022, 0.0012) and "alpha 22.00 ms" in said
    path.write_text(json.dumps({"alpha_seconds": None, "beta_seconds": 0.0012}))
    line, said = prior.from_profile(str(path))
    assert line is None and "slow start" in said
    assert prior.from_profile("")[0] is None and prior.from_profile(str(tmp_path / "none.json"))[0] is None
