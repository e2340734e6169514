"""This tool's measurement definitions against `vllm bench serve`'s, on the same recorded streams.

`data/recorded_streams.json` holds streamed /v1/completions responses in vLLM's wire format, each
read with the time it reached the client.  They are replayed through both real clients (this tool's
`OpenAIStreamClient.stream`, vLLM's `async_request_openai_completions`) with the clock both read set
to the recorded times, and through both real aggregations (this tool's `bench.stats.summarize`,
vLLM's `vllm.benchmarks.serve.calculate_metrics`).  Nothing here depends on how fast the machine is.

Where the definitions coincide the numbers must be equal (to float rounding):
* output throughput = output tokens (from `usage`) / run duration;
* TTFT = first output chunk - request sent, and its median and percentiles (linear interpolation);
* a stream's decode rate = (output tokens - 1) / (last token - first token) = 1 / vLLM's TPOT, also
  when chunks carry several tokens or one carries no text.

Where they part, the difference is exactly the documented one (docs/bench.md):
* an empty closing chunk that carries only `finish_reason` ends vLLM's latency, not this tool's
  last-token time;
* a stream delivered in a few bursts (`client.is_bunched`) has no decode rate here; vLLM counts its TPOT;
* the median across streams: this tool takes the median of rates, vLLM the median of TPOTs: with an
  even count the middle two are averaged as rates here (arithmetic mean) and as times there
  (harmonic mean of the rates);
* aggregate throughput (seed 003): sum of (tokens - 1) over the time from the first first token to
  the last last token; vLLM has no such number (its output throughput uses the run duration).

The throughput comparison on a live server is a benchmark, not a test: `benchmarks/peer_check.py`.
"""
from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

import aiohttp
import pytest

from vllm.benchmarks.datasets import SampleRequest
from vllm.benchmarks.lib import endpoint_request_func as vllm_request
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, RequestFuncOutput
from vllm.benchmarks.serve import calculate_metrics

from vllm_spark_plugin.bench import client as our_client
from vllm_spark_plugin.bench.client import OpenAIStreamClient, StreamResult
from vllm_spark_plugin.bench.stats import summarize

RECORDING = json.loads((Path(__file__).parent / "data" / "recorded_streams.json").read_text())
STREAMS = {s["name"]: s for s in RECORDING["streams"]}
BY_PROMPT = {s["prompt"]: s for s in RECORDING["streams"]}
DURATION = RECORDING["duration"]
URL = "http://replay.invalid"
PERCENTILES = [50.0, 90.0, 99.0]
COINCIDE = ["steady", "steady-slower", "held-back-text", "three-per-chunk"]


class ReplayClock:
    """The clock both clients read (`time.perf_counter`): set to each read's recorded time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter


class _Content:
    def __init__(self, stream: dict, clock: ReplayClock) -> None:
        self.stream, self.clock = stream, clock

    async def iter_any(self):
        for at, text in self.stream["reads"]:
            self.clock.now = at  # the read reaches the client at its recorded time
            yield text.encode()


class _Response:
    """The slice of `aiohttp.ClientResponse` both clients use."""

    def __init__(self, stream: dict, clock: ReplayClock) -> None:
        self.status = stream["status"]
        self.reason = "Internal Server Error" if self.status == 500 else "OK"
        self.content = _Content(stream, clock)
        self._body = stream.get("error_body", "")

    async def text(self) -> str:
        return self._body

    async def __aenter__(self) -> "_Response":
        return self

    async def __aexit__(self, *exc) -> None:
        return None


class _Pending:
    """What `session.post` returns: awaited (this tool) or entered (vLLM), as aiohttp's is."""

    def __init__(self, response: _Response) -> None:
        self.response = response

    def __await__(self):
        return self._get().__await__()

    async def _get(self) -> _Response:
        return self.response

    async def __aenter__(self) -> _Response:
        return self.response

    async def __aexit__(self, *exc) -> None:
        return None


class ReplaySession:
    """An `aiohttp.ClientSession` that answers each request with the recorded stream of its prompt."""

    clock = ReplayClock()

    def __init__(self, *args, **kwargs) -> None:
        self.closed = False

    def post(self, url, data=None, json=None, headers=None, **kwargs) -> _Pending:  # noqa: A002 - aiohttp's names
        body = json if json is not None else _loads(data)
        assert url == URL + "/v1/completions" and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
        return _Pending(_Response(BY_PROMPT[body["prompt"]], self.clock))

    async def close(self) -> None:
        self.closed = True


def _loads(data: bytes) -> dict:
    return json.loads(data)  # `post` has a parameter named json (aiohttp's), which hides the module there


@pytest.fixture
def replay(monkeypatch):
    """Both clients read the replay clock; this tool's client opens a replay session."""
    clock = ReplaySession.clock
    monkeypatch.setattr(our_client, "time", clock)
    monkeypatch.setattr(vllm_request, "time", clock)
    monkeypatch.setattr(aiohttp, "ClientSession", ReplaySession)
    return clock


def replay_ours(names: list[str], clock: ReplayClock) -> list[StreamResult]:
    async def run() -> list[StreamResult]:
        out = []
        async with OpenAIStreamClient(URL, RECORDING["model"], api="completions") as client:
            for name in names:
                s = STREAMS[name]
                clock.now = s["start"]  # the request is sent at its recorded time
                out.append(await client.stream(s["prompt"], s["max_tokens"]))
        return out
    return asyncio.run(run())


def replay_vllm(names: list[str], clock: ReplayClock) -> list[RequestFuncOutput]:
    async def run() -> list[RequestFuncOutput]:
        out = []
        session = ReplaySession()
        for name in names:
            s = STREAMS[name]
            clock.now = s["start"]
            request = RequestFuncInput(prompt=s["prompt"], api_url=URL + "/v1/completions",
                                       prompt_len=s["prompt_tokens"], output_len=s["max_tokens"],
                                       model=RECORDING["model"], ignore_eos=True)
            out.append(await vllm_request.async_request_openai_completions(request, session))
        return out
    return asyncio.run(run())


def vllm_metrics(names: list[str], outputs: list[RequestFuncOutput]):
    requests = [SampleRequest(prompt=STREAMS[n]["prompt"], prompt_len=STREAMS[n]["prompt_tokens"],
                              expected_output_len=STREAMS[n]["max_tokens"]) for n in names]
    metrics, _ = calculate_metrics(input_requests=requests, outputs=outputs, dur_s=DURATION, tokenizer=None,
                                   selected_percentiles=PERCENTILES, goodput_config_dict={})
    return metrics


def vllm_tpot(name: str, output: RequestFuncOutput) -> float:
    """vLLM's TPOT of one request, from its own aggregation of that request alone (seconds)."""
    return vllm_metrics([name], [output]).median_tpot_ms / 1000


def _first_read(name: str) -> float:
    return STREAMS[name]["reads"][0][0]


def _last_token_read(name: str) -> float:
    """Time of the last read that carried generated text (the recording's ground truth)."""
    return max(at for at, text in STREAMS[name]["reads"] if '"text":" ' in text)


@pytest.fixture
def both(replay):
    names = list(STREAMS)
    return names, dict(zip(names, replay_ours(names, replay))), dict(zip(names, replay_vllm(names, replay)))


def test_output_throughput_and_counts_agree(both):
    names, ours, theirs = both
    m = summarize([list(ours.values())], [DURATION])
    v = vllm_metrics(names, list(theirs.values()))
    assert (m.requests, m.completed, m.errors) == (7, 6, 1)
    assert (v.completed, v.failed) == (m.completed, m.errors)
    assert m.output_tokens == v.total_output == 92  # usage's completion_tokens, never the chunk count
    assert m.prompt_tokens == v.total_input == 6 * 16
    assert m.output_tps == pytest.approx(v.output_throughput, rel=1e-12)
    assert m.output_tps == pytest.approx(92 / DURATION, rel=1e-12)
    assert ours["failed"].timing.error == "HTTP 500: engine dead" and not theirs["failed"].success


def test_ttft_agrees_per_request_and_in_percentiles(both):
    names, ours, theirs = both
    for name in names:
        if name == "failed":
            continue
        expected = _first_read(name) - STREAMS[name]["start"]
        assert ours[name].timing.ttft == pytest.approx(expected, abs=1e-12), name
        assert theirs[name].ttft == pytest.approx(expected, abs=1e-12), name
    m = summarize([list(ours.values())], [DURATION])
    v = vllm_metrics(names, list(theirs.values()))
    assert m.ttft_p50_s == pytest.approx(v.median_ttft_ms / 1000, rel=1e-12)
    assert [m.ttft_p50_s, m.ttft_p90_s, m.ttft_p99_s] == pytest.approx(
        [ms / 1000 for _, ms in v.percentiles_ttft_ms], rel=1e-12)


@pytest.mark.parametrize("name", COINCIDE)
def test_stream_rate_is_the_inverse_of_vllm_tpot(both, name):
    _, ours, theirs = both
    expected = (STREAMS[name]["max_tokens"] - 1) / (_last_token_read(name) - _first_read(name))
    assert ours[name].timing.decode_rate == pytest.approx(expected, rel=1e-12)
    assert 1 / vllm_tpot(name, theirs[name]) == pytest.approx(expected, rel=1e-12)


def test_empty_closing_chunk_ends_vllm_latency_not_the_stream(both):
    """The closing chunk (no text, finish_reason only) came 90 ms after the last token: vLLM's TPOT
    spreads those 90 ms over the stream, this tool's last-token time does not."""
    _, ours, theirs = both
    s = STREAMS["closing-chunk"]
    first, last_token, closing = _first_read("closing-chunk"), _last_token_read("closing-chunk"), s["reads"][-1][0]
    assert closing - last_token == pytest.approx(0.090, abs=1e-12)
    assert ours["closing-chunk"].timing.decode_rate == pytest.approx(7 / (last_token - first), rel=1e-12)
    assert theirs["closing-chunk"].latency == pytest.approx(closing - s["start"], abs=1e-12)
    assert vllm_tpot("closing-chunk", theirs["closing-chunk"]) == pytest.approx((closing - first) / 7, rel=1e-12)


def test_bunched_stream_has_no_rate_here_and_a_tpot_there(both):
    names, ours, theirs = both
    b = ours["bunched"]
    assert b.bunched and b.arrivals == 2 and b.timing.output_tokens == 40
    m = summarize([list(ours.values())], [DURATION])
    assert m.bunched_streams == 1
    rates = [ours[n].timing.decode_rate for n in names if n not in ("bunched", "failed")]
    assert m.per_stream_median_tps == pytest.approx(statistics.median(rates), rel=1e-12)  # 5 streams, bunched left out
    v = vllm_metrics(names, list(theirs.values()))
    tpots = [vllm_tpot(n, theirs[n]) for n in names if n != "failed"]
    assert vllm_tpot("bunched", theirs["bunched"]) == pytest.approx((0.900 - 0.650) / 39, rel=1e-12)
    assert v.median_tpot_ms / 1000 == pytest.approx(statistics.median(tpots), rel=1e-12)  # 6 streams


def test_median_across_streams_agrees_for_odd_counts_and_differs_as_documented_for_even(replay):
    odd = COINCIDE[:3]
    m = summarize([replay_ours(odd, replay)], [DURATION])
    v = vllm_metrics(odd, replay_vllm(odd, replay))
    assert m.per_stream_median_tps == pytest.approx(1000 / v.median_tpot_ms, rel=1e-12)

    even = COINCIDE
    ours = replay_ours(even, replay)
    m = summarize([ours], [DURATION])
    v = vllm_metrics(even, replay_vllm(even, replay))
    lo, hi = sorted(s.timing.decode_rate for s in ours)[1:3]  # the middle two of four
    assert lo < hi
    assert m.per_stream_median_tps == pytest.approx((lo + hi) / 2, rel=1e-12)            # arithmetic here
    assert 1000 / v.median_tpot_ms == pytest.approx(2 / (1 / lo + 1 / hi), rel=1e-12)    # harmonic there
    assert 1000 / v.median_tpot_ms < m.per_stream_median_tps


def test_aggregate_throughput_is_the_seed_definition_not_output_throughput(both):
    names, ours, theirs = both
    m = summarize([list(ours.values())], [DURATION])
    timed = [n for n in names if n not in ("bunched", "failed")]
    tokens = sum(STREAMS[n]["max_tokens"] - 1 for n in timed)
    span = max(_last_token_read(n) for n in timed) - min(_first_read(n) for n in timed)
    assert m.aggregate_tps == pytest.approx(tokens / span, rel=1e-12)
    v = vllm_metrics(names, list(theirs.values()))
    assert v.output_throughput == pytest.approx(92 / DURATION, rel=1e-12) != m.aggregate_tps
