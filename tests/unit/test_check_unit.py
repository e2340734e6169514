"""`vllm-spark check` (acceptance/): the pure parts (which model is planned, how the run is sized from
the prediction, the prediction lined up with the measurement) and the command's errors.  Whole runs
against the fake server on the wall clock: tests/integration/test_check_fake.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_spark_plugin import doctor
from vllm_spark_plugin.acceptance import prediction as P
from vllm_spark_plugin.cli import main as vllm_spark

def test_an_unreachable_server_is_reported_not_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: [doctor.Check("vllm", doctor.OK, "fine")])
    out = tmp_path / "down"
    assert vllm_spark(["check", "--quiet", "--endpoint", "http://127.0.0.1:9", "--out", str(out)]) == 3
    doc = json.loads((out / "check.json").read_text())
    assert doc["server"] is None and doc["comparison"] == []
    assert doc["notes"][0].startswith("the server could not be measured: http://127.0.0.1:9")
    assert (out / "report.html").exists()


@pytest.mark.parametrize("argv, message", [(["--minutes", "0.5"], "--minutes 0.5 leaves no time to measure"),
                                           (["--minutes", "-1"], "expected a positive number")])
def test_bad_check_options_are_one_line_errors(argv, message, capsys):
    try:
        rc = vllm_spark(["check", "--quiet", *argv])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]


# ------------------------------------------------------------------------------------- pure parts
def test_the_planned_model_is_the_given_one_a_built_in_name_or_the_served_folder(tmp_path):
    assert P.model_spec("llama3.1-8b", "anything", None) == ("llama3.1-8b", "--plan-model")
    assert P.model_spec(None, "Qwen/Qwen3.6-35B-A3B", None)[0] == "Qwen/Qwen3.6-35B-A3B"
    (tmp_path / "config.json").write_text("{}")
    assert P.model_spec(None, "my-model", str(tmp_path))[0] == str(tmp_path)
    spec, why = P.model_spec(None, "my-model", "/nowhere")
    assert spec is None and "--plan-model" in why


@pytest.mark.parametrize("quant, fmt", [(None, "bf16"), ({"quant_algo": "NVFP4"}, "nvfp4"),
                                        ({"quant_method": "mxfp4"}, "mxfp4"), ({"quant_method": "fp8"}, "fp8")])
def test_weight_format_comes_from_the_checkpoint(tmp_path, quant, fmt):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": quant} if quant else {}))
    assert P.weight_format_of(tmp_path) == fmt


def test_the_run_is_sized_from_the_prediction_to_fit_the_budget():
    pred = P.predict("qwen3.6-35b", hardware="gb10", weight_format=None, floor=20.0, prompt_tokens=512,
                     output_tokens=256)
    roomy = P.size_run(pred, 20.0, 3600.0, None, 256, 512)
    assert roomy.trials == 3 and roomy.output_tokens == 256 and roomy.predicted_seconds <= 0.8 * 3600
    assert roomy.predicted_levels[0] == 1 and "the planner predicts" in roomy.reason
    tight = P.size_run(pred, 20.0, 120.0, None, 256, 512)
    assert (tight.trials, tight.output_tokens) < (3, 256) and tight.budget_seconds == 120.0
    # the default check on a Spark: the predicted measurement fits in the 10 minutes
    spark = P.size_run(pred, 20.0, 600.0 - 30.0, None, 256, 512)
    assert spark.predicted_seconds <= 0.8 * 570 and spark.max_concurrency <= 512


def test_comparison_rows_hold_both_sides_and_their_ratio():
    pred = P.predict("qwen3.6-35b", hardware="gb10", weight_format=None, floor=20.0, prompt_tokens=512,
                     output_tokens=256)
    summary = {"curves": [{"capacity": {"20": 8},
                           "knee": {"knee": 12.0, "plateau_tokens_per_second": 500.0, "ci": {"knee": [10.0, 15.0]}},
                           "points": [{"concurrency": 1, "per_stream_median_tps": 40.0, "aggregate_tps": 40.0,
                                       "ttft_p50_s": 0.1},
                                      {"concurrency": 8, "per_stream_median_tps": 25.0, "aggregate_tps": 200.0,
                                       "ttft_p50_s": 0.4}]}]}
    rows = {r["quantity"]: r for r in P.compare(pred, summary, 20.0)}
    r1 = rows["per-stream rate at 1 stream(s), tok/s"]
    assert r1["measured"] == 40.0 and r1["ratio"] == pytest.approx(40.0 / pred.per_stream(1))
    assert rows["knee K = alpha/beta, streams"]["measured_interval"] == [10.0, 15.0]
    assert rows["capacity at 20 tok/s, streams"]["predicted"] == pred.plan["capacity"]["streams"]
    assert rows["aggregate at 8 streams, tok/s"]["measured"] == 200.0
    none = {r["quantity"]: r for r in P.compare(None, summary, 20.0)}
    assert all(r["predicted"] is None and r["ratio"] is None for r in none.values())


# ------------------------------------------------------------------------------------- a sweep already run
SWEEPS = Path(__file__).resolve().parents[1] / "fixtures" / "sweeps"


@pytest.mark.parametrize("tool", ["guidellm", "aiperf"])
def test_check_fits_a_sweep_another_tool_ran_without_measuring(tool, tmp_path, monkeypatch):
    # the real exports in tests/fixtures/sweeps; the server is down, so nothing could have been measured
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: [doctor.Check("vllm", doctor.OK, "fine")])
    out = tmp_path / tool
    rc = vllm_spark(["check", "--quiet", "--endpoint", "http://127.0.0.1:9", "--sweep", str(SWEEPS / tool),
                     "--floor", "20", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "check.json").read_text())
    from vllm_spark_plugin.knee.fit import fit_points
    from vllm_spark_plugin.knee.loaders import load_points
    (label, points), = load_points([SWEEPS / tool]).items()
    res = fit_points(points, floors=[20.0])
    rows = {r["quantity"]: r for r in doc["comparison"]}
    assert rows["knee K = alpha/beta, streams"]["measured"] == res.knee
    assert rows["capacity at 20 tok/s, streams"]["measured"] == res.capacity_at(20.0)
    low = min(p.concurrency for p in points)
    assert rows[f"per-stream rate at {low:g} stream(s), tok/s"]["measured"] == \
        min(points, key=lambda p: p.concurrency).per_stream_tokens_per_second
    assert doc["sweep"] == [str(SWEEPS / tool)] and doc["bench"]["status"].startswith(f"fitted {label}")
    assert "a sweep already run" in (out / "report.html").read_text()


def test_check_names_a_sweep_it_cannot_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: [doctor.Check("vllm", doctor.OK, "fine")])
    bad = tmp_path / "notes.txt"
    bad.write_text("not a sweep\n")
    rc = vllm_spark(["check", "--quiet", "--endpoint", "http://127.0.0.1:9", "--sweep", str(bad),
                     "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--sweep" in err and "notes.txt" in err
