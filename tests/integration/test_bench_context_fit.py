"""Every bench scenario fits the server's context window: the long-prompt scenarios shorten their
prompt to the `max_model_len` preflight read (and say so in their notes), and a sweep whose requests
cannot fit is refused before any request is sent, naming the option that fixes it.  Against the
session's CPU vLLM server (max_model_len 2048), counting its HTTP answers on its own /metrics."""
from __future__ import annotations

import json
import re

import pytest
from support.scrape import scrape, value

from vllm_spark_plugin.cli import main as vllm_spark

GENERATE = "/v1/chat/completions"


def answers(server) -> dict[str, float]:
    """Requests the server answered on the chat endpoint, by status class."""
    samples = scrape(server.metrics_url)
    return {cls: value(samples, "http_requests_total", handler=GENERATE, status=cls) for cls in ("2xx", "4xx")}


def bench(server, tmp_path, *options: str) -> int:
    return vllm_spark(["bench", "--quiet", "--endpoint", server.base_url, "--model", server.model,
                       "--out", str(tmp_path / "run"), *options])


@pytest.mark.server
def test_long_prompt_scenarios_shorten_their_prompts_to_max_model_len(vllm_server, tmp_path):
    """The default 32,000-token document, chat API: both scenarios fit 2048 and say so alike.

    Random-word prompts are only about the length asked for; with seed 57 they come out long
    (on the tiny model, 7% past the 2,032 tokens the document used to be cut to)."""
    before = answers(vllm_server)
    rc = bench(vllm_server, tmp_path, "--seed", "57", "--scenario", "prefix-reuse", "--reuse-repeats", "1",
               "--scenario", "prefill-interference", "--scenario-streams", "2", "--baseline-seconds", "1",
               "--tail-seconds", "1", "--output-tokens", "32")
    after = answers(vllm_server)
    assert rc == 0, json.loads((tmp_path / "run" / "summary.json").read_text())["message"]
    assert after["4xx"] - before["4xx"] == 0, "the server refused requests (context too long?)"
    assert after["2xx"] - before["2xx"] >= 3  # two documents (cold, cached), the long prompt, ...

    scenarios = json.loads((tmp_path / "run" / "summary.json").read_text())["scenarios"]
    reuse, interference = scenarios["prefix-reuse"], scenarios["prefill-interference"]
    note = re.compile(r"long prompt shortened from 32000 to (\d+) tokens to fit max_model_len 2048")
    reuse_note = next(m for m in map(note.fullmatch, reuse["notes"]) if m)
    interference_note = next(m for m in map(note.fullmatch, interference["notes"]) if m)
    assert int(reuse_note[1]) == reuse["document_tokens"]
    assert int(interference_note[1]) == interference["long_prompt"]["requested_tokens"]
    # what the server counted: long (most of the window), and within it
    for tokens in [p["prompt_tokens"] for p in reuse["pairs"]] + [interference["long_prompt"]["prompt_tokens"]]:
        assert 1024 < tokens < 2048
    assert "long prompt shortened" in (tmp_path / "run" / "report.html").read_text()


@pytest.mark.server
@pytest.mark.parametrize("options,named", [
    (["--workload", "random", "--random-input-len", "4000"], "--random-input-len"),
    (["--workload", "code", "--output-tokens", "4000"], "--output-tokens"),
])
def test_sweep_that_cannot_fit_is_refused_before_sending(vllm_server, tmp_path, capsys, options, named):
    before = answers(vllm_server)
    rc = bench(vllm_server, tmp_path, "--levels", "1", "--trials", "1", *options)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert named in err and "max_model_len 2048" in err and vllm_server.base_url in err, err
    assert answers(vllm_server) == before, "requests were sent before the refusal"
    assert not (tmp_path / "run").exists()
