"""`vllm-spark plan` end to end through the real command's entry (`vllm_spark_plugin.cli.main`, what
`vllm-spark` and `python -m vllm_spark_plugin.cli` call), in this process: its output, files and exit
status.  That the module entry runs in a fresh interpreter is tests/contract/test_cli_process.py's."""
from __future__ import annotations

import contextlib
import io
import json
from types import SimpleNamespace

import pytest

from vllm_spark_plugin.cli import main as vllm_spark


def plan(*args, check_rc=None):
    """The command's exit status and what it wrote to stdout and stderr (argparse's usage errors
    included: they exit through SystemExit)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = vllm_spark(["plan", *args])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    proc = SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr + proc.stdout
    return proc


def test_table_shows_memory_steps_curve_knee_and_capacity():
    out = plan("--model", "Qwen3.6-35B-A3B", "--concurrency", "1,8,64", check_rc=0).stdout
    assert "Memory fit (per node)" in out
    assert "usable memory = min(gpu_memory_utilization x memory, memory - OS reserve)" in out
    assert "linear-attention state" in out and "max concurrent streams" in out
    assert "knee K = alpha/beta" in out
    assert "Capacity at the 20 tok/s per-stream floor" in out
    lines = [l.split() for l in out.splitlines() if l.strip() and l.split()[0] in ("1", "8", "64")]
    assert [int(l[0]) for l in lines] == [1, 8, 64]
    aggregates = [float(l[3]) for l in lines]
    assert aggregates == sorted(aggregates)


def test_json_schema():
    proc = plan("--model", "gpt-oss-120b", "--weight-format", "mxfp4", "--json", "--context", "8192", check_rc=0)
    doc = json.loads(proc.stdout)
    for key in ("curve", "memory", "step_model", "knee", "capacity", "inputs", "calibration", "fleet", "model"):
        assert key in doc, key
    row = doc["curve"][0]
    assert set(("concurrency", "aggregate_tokens_per_second", "per_stream_tokens_per_second",
                "ttft_seconds")) <= set(row)
    assert doc["step_model"]["alpha_seconds"] > 0 and doc["step_model"]["beta_seconds"] > 0
    assert doc["inputs"]["context_tokens"] == 8192
    assert doc["inputs"]["component_formats"]["attention"] == "bf16"  # mxfp4 covers the experts only
    assert doc["memory"]["max_concurrent_streams"] >= 1 and doc["memory"]["steps"]
    assert doc["calibration"]["source"] == "defaults"


def test_plot_writes_a_png(tmp_path):
    png = tmp_path / "curve.png"
    plan("--model", "Llama-3.1-8B", "--weight-format", "fp8", "--plot", str(png), check_rc=0)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_config_json_path_and_calibration_roundtrip(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
                               "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 8192,
                               "vocab_size": 32000}))
    cal = tmp_path / "cal.json"
    plan("--model", "Qwen3.6-35B-A3B", "--calibrate-point", "1:40.715", "--calibrate-point", "64:557.471",
         "--save-calibration", str(cal), "--json", check_rc=0)
    saved = json.loads(cal.read_text())
    assert saved["version"] == 2 and saved["model"]["name"] == "Qwen3.6-35B-A3B"
    assert {"bandwidth", "overhead[vllm]", "skew[Qwen3.6-35B-A3B]"} <= set(saved["fitted"])
    hw = tmp_path / "box.json"
    hw.write_text(json.dumps({"name": "box", "memory_bytes": 64e9, "bandwidth_nominal_bytes_per_second": 500e9,
                              "compute_flops_per_second": {"bf16": 200e12}}))
    doc = json.loads(plan("--model", str(cfg), "--hardware", str(hw), "--calibration", str(cal), "--json",
                          check_rc=0).stdout)
    assert doc["calibration"]["source"] == "calibration file"
    assert doc["calibration"]["model_factors"] is None  # the Qwen3.6 factors stay with Qwen3.6
    assert doc["model"]["layers"]["total"] == 16
    assert doc["hardware"]["name"] == "box" and doc["memory"]["memory_bytes"] == 64e9
    # a calibration fitted on gb10 applied to another box is allowed, with a warning
    proc = plan("--model", str(cfg), "--hardware", str(hw), "--calibration", str(cal), check_rc=0)
    assert "fitted on 'gb10'" in proc.stderr
    hw.write_text(json.dumps({"name": "box", "memory_bytes": -1, "bandwidth_nominal_bytes_per_second": 1e11,
                              "compute_flops_per_second": {"bf16": 1e14}}))
    assert "memory_bytes" in plan("--model", str(cfg), "--hardware", str(hw), check_rc=2).stderr


def test_multi_spark_fleet():
    doc = json.loads(plan("--model", "Nemotron-3-Super-120B-A12B", "--sparks", "4", "--tp", "2", "--json",
                          check_rc=0).stdout)
    assert doc["fleet"]["replicas"] == 2 and doc["fleet"]["tp"] == 2
    assert doc["fleet"]["capacity_streams"] == 2 * doc["capacity"]["streams"]
    assert doc["step_model"]["components_at_1"]["comm"] > 0


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent/dir/config.json"], "config file not found"),
    (["--model", "No-Such-Model-9B"], "unknown model 'No-Such-Model-9B'"),
    (["--model", "Llama-3.1-8B", "--hardware", "tpu9"], "unknown hardware 'tpu9'"),
    (["--model", "Llama-3.1-8B", "--component-format", "lm_head=fp3"], "unknown weight format 'fp3'"),
    (["--model", "Llama-3.1-8B", "--sparks", "3", "--tp", "2"], "not a multiple of tp*pp"),
    (["--model", "Llama-3.1-8B", "--calibration", "/nonexistent/cal.json"], "calibration file not found"),
    (["--model", "Llama-3.1-8B", "--expert-parallel"], "expert parallelism needs"),
    (["--model", "Qwen3.6-35B-A3B", "--spec-tokens", "1", "--spec-acceptance-length", "3"],
     "acceptance length must lie in [1, 2]"),
    (["--model", "Qwen3.6-35B-A3B", "--spec-acceptance-length", "1.8"], "need --spec-tokens"),
    (["--model", "Qwen3.6-35B-A3B", "--spec-tokens", "2", "--spec-method", "draft"], "draft model needs its cost"),
])
def test_bad_input_exits_2_with_a_clear_message(args, message):
    proc = plan(*args, check_rc=2)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "Llama-3.1-8B", "--tp", "0"], "expected a positive integer, got '0'"),
    (["--model", "Llama-3.1-8B", "--weight-format", "int3"], "invalid choice: 'int3'"),
    (["--model", "Llama-3.1-8B", "--concurrency", "1,x"], "comma-separated positive integers"),
    (["--model", "Llama-3.1-8B", "--engine", "ollama"], "invalid choice: 'ollama'"),
    (["--model", "Llama-3.1-8B", "--moe-backend", "cuda"], "invalid choice: 'cuda'"),
    (["--model", "Llama-3.1-8B", "--routing-skew", "-1"], "expected a number >= 0"),
])
def test_bad_argument_exits_2(args, message):
    proc = plan(*args, check_rc=2)
    assert message in proc.stderr


def test_bad_config_content(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    proc = plan("--model", str(cfg), check_rc=2)
    assert "hidden_size" in proc.stderr
    cfg.write_text("{not json")
    assert "not valid JSON" in plan("--model", str(cfg), check_rc=2).stderr


def test_serving_options_move_the_prediction_the_published_way():
    """--enforce-eager slows decode, MTP speeds up one stream, llama.cpp's lower overhead speeds it up
    (in process: the same argument parsing and deployment building as the command)."""
    import argparse

    from vllm_spark_plugin.plan.cli import add_arguments, build_deployment
    from vllm_spark_plugin.plan.stepmodel import StepModel

    def rate(model, *extra):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        dep, _ = build_deployment(parser.parse_args(["--model", model, *extra]))
        return StepModel(dep).aggregate_rate(1), dep
    base, dep = rate("gpt-oss-120b", "--weight-format", "mxfp4")
    assert dep.serving.engine == "vllm" and dep.routing_skew()[0] > 0
    assert rate("gpt-oss-120b", "--weight-format", "mxfp4", "--enforce-eager")[0] < 0.6 * base  # published 59 -> 26
    assert rate("gpt-oss-120b", "--weight-format", "mxfp4", "--engine", "llama.cpp")[0] > base
    # one stream: the routing skew cannot matter
    assert rate("gpt-oss-120b", "--weight-format", "mxfp4", "--routing-skew", "0")[0] == pytest.approx(base)
    # MTP-1 at the published 85 % acceptance: published gains +25 % (Qwen3.5-122B) to about 2x
    qwen = rate("Qwen3.6-35B-A3B")[0]
    assert 1.2 * qwen < rate("Qwen3.6-35B-A3B", "--spec-tokens", "1")[0] < 2.0 * qwen
