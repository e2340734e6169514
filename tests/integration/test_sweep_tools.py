"""NVIDIA AIPerf and GuideLLM, each installed in a virtual environment of its own
(scripts/tool-env.sh), sweep the session's CPU server (concurrency 1, 2, 4); `vllm-spark knee` reads
the folder each one wrote and fits it.

Checked: the points read are the tool's own concurrency levels, each with the tool's own request
count and a per-stream rate wherever the tool's file has one, and the fit runs.  AIPerf read every
stream of a level in one burst once (its intervals all 0, its per-user throughput null, at
concurrency 2 of a clean-clone run): the reader then has no rate for that level, as the file has none.  The tools' timings are not judged: on 2 shared cores a client reads streams
in bursts (FIELD_NOTES §8), and the tools' clients are pinned to a core of their own where there is
one, not the server.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_spark_plugin.cli import main as vllm_spark
from vllm_spark_plugin.knee.loaders import load_points

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parents[2]
LEVELS = (1, 2, 4)
REQUESTS = 8  # per level
TOKENS = 32   # prompt and output tokens per request
RUN_TIMEOUT = 300


@pytest.fixture(scope="module")
def tools() -> dict[str, Path]:
    """Both tools' executables, installed side by side on first use (minutes each; then a no-op)."""
    installs = {name: subprocess.Popen(["bash", str(ROOT / "scripts" / "tool-env.sh"), name],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for name in ("aiperf", "guidellm")}
    found = {}
    for name, proc in installs.items():
        out, err = proc.communicate(timeout=3600)
        assert proc.returncode == 0, f"scripts/tool-env.sh {name} failed:\n{err}"
        found[name] = Path(out.strip().splitlines()[-1]) / name
    return found


def pinned(cmd: list[str]) -> list[str]:
    """The client on the last core this process may use, when there are two or more (taskset)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1 and shutil.which("taskset"):
        return ["taskset", "-c", str(cores[-1]), *cmd]
    return cmd


def run_tool(cmd: list[str], cwd: Path, env: dict | None = None) -> None:
    done = subprocess.run(pinned(cmd), cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"{Path(cmd[0]).name} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"


def knee_json(folder: Path, capsys) -> dict:
    capsys.readouterr()
    assert vllm_spark(["knee", str(folder), "--json", "--floor", "20", "--bootstrap", "200"]) == 0
    return json.loads(capsys.readouterr().out)


def assert_read_and_fitted(folder: Path, model: str, capsys, requests: list[int] | None = None,
                           rated: list[bool] | None = None) -> None:
    """`requests`: the finished requests per level as the tool's own file records them (default: all);
    `rated`: per level, whether the file holds a per-stream rate (default: every level)."""
    [(label, points)] = load_points(folder).items()
    assert label == model
    assert [p.concurrency for p in points] == list(LEVELS)
    assert [p.extra["requests"] for p in points] == (requests or [REQUESTS] * len(LEVELS))
    rated = rated or [True] * len(LEVELS)
    assert [bool(p.per_stream_tokens_per_second) for p in points] == rated
    assert all(p.aggregate_tokens_per_second and p.ttft_p50_seconds for p in points)
    fit = knee_json(folder, capsys)
    assert fit["label"] == model and fit["n"] == len(LEVELS) + sum(rated)  # each rate and each aggregate
    assert fit["verdict"] and "20" in fit["capacity"]


def aiperf_rated(folder: Path) -> list[bool]:
    """Per level, whether AIPerf's own sweep file has a per-stream rate: a per-user throughput, or a
    median inter-token latency above 0.  A client that read every stream of a level in one burst (2
    shared cores) records neither: its intervals are all 0 and its per-user throughput null."""
    combos = json.loads((folder / "sweep_aggregate" / "profile_export_aiperf_sweep.json").read_text())
    out = []
    for c in combos["per_combination_metrics"]:
        m = c.get("metrics", c)
        itl = (m.get("inter_token_latency") or {}).get("p50")
        out.append(isinstance(m.get("output_token_throughput_per_user"), dict) or bool(itl))
    return out


def test_aiperf_sweep_is_read_and_fitted(tools, vllm_server, tiny_model_path, tmp_path, capsys):
    out = tmp_path / "aiperf"
    # No HF_HUB_OFFLINE: aiperf 0.13 then looks a local tokenizer folder up in the hub cache and fails;
    # a local path is never looked up online.
    env = {"HF_HUB_OFFLINE": ""}
    run_tool([str(tools["aiperf"]), "profile", "--model", vllm_server.model, "--url", vllm_server.base_url,
              "--endpoint-type", "completions", "--streaming", "--use-server-token-count",
              "--tokenizer", str(tiny_model_path), "--concurrency", ",".join(map(str, LEVELS)),
              "--request-count", str(REQUESTS), "--prompt-input-tokens-mean", str(TOKENS),
              "--prompt-output-tokens-mean", str(TOKENS), "--extra-inputs", "ignore_eos:true",
              "--output-artifact-dir", str(out), "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
              "--random-seed", "1"], tmp_path, env)
    assert (out / "sweep_aggregate" / "profile_export_aiperf_sweep.json").is_file()
    rated = aiperf_rated(out)
    assert sum(rated) >= 2, f"AIPerf's file has a per-stream rate at {sum(rated)} of {len(LEVELS)} levels: no fit"
    assert_read_and_fitted(out, vllm_server.model, capsys, rated=rated)


def test_guidellm_sweep_is_read_and_fitted(tools, vllm_server, tiny_model_path, tmp_path, capsys):
    out = tmp_path / "guidellm"
    run_tool([str(tools["guidellm"]), "run",
              "--backend", f"kind=openai_http,target={vllm_server.base_url},model={vllm_server.model}",
              "--profile", "kind=concurrent,streams=1", "--override", "profile.streams", ",".join(map(str, LEVELS)),
              "--constraint", f"kind=max_requests,count={REQUESTS}",
              "--data", f"kind=synthetic_text,prompt_tokens={TOKENS},output_tokens={TOKENS}",
              "--tokenizer", f"kind=huggingface_auto,model={tiny_model_path}",
              "--output", f"kind=json,path={out / 'benchmarks.json'}", "--disable-console"],
             tmp_path, {"HF_HUB_OFFLINE": "1"})
    # guidellm now and then ends a level once its count of requests is created, the last one still in
    # flight (its scheduler state: created 8, processed 7, processing 1): the reader must count what the
    # file records as successful, and a level keeps all of its requests but that one at most
    recorded = [len(b["requests"]["successful"])
                for b in json.loads((out / "benchmarks.json").read_text())["benchmarks"]]
    assert all(REQUESTS - 1 <= n <= REQUESTS for n in recorded), recorded
    assert_read_and_fitted(out, vllm_server.model, capsys, recorded)
