"""The streaming client's token-arrival rules, against scripted SSE streams on a loopback server:
which chunks count as token arrivals, usage-based token counts, messages split across reads,
non-compact JSON, error bodies and mid-stream errors."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from vllm_spark_plugin.bench.client import OpenAIStreamClient, Timeouts



def chat(content=None, finish=None, role=False, compact=True):
    delta = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    obj = {"id": "x", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    sep = (",", ":") if compact else (", ", ": ")
    return "data: " + json.dumps(obj, separators=sep) + "\n\n"


def usage(n, prompt=7):
    return "data: " + json.dumps({"id": "x", "choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": n, "total_tokens": n + prompt}}, separators=(",", ":")) + "\n\n"


async def serve(script):
    """A server that plays `script`: a list of (delay_s, text) pieces written to the stream."""
    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for delay, piece in script:
            await asyncio.sleep(delay)
            await resp.write(piece.encode())
        return resp

    async def error(request):
        return web.json_response({"error": {"message": "max_tokens is too large", "code": 400}}, status=400)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_post("/v1/completions", error)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def run(script, api="chat", **kw):
    runner, url = await serve(script)
    try:
        async with OpenAIStreamClient(url, "m", api=api, timeouts=Timeouts(2, kw.pop("read", 5), 10)) as c:
            times: list[float] = []
            res = await c.stream("hi", kw.pop("max_tokens", 4), chunk_times=times)
            return res, times
    finally:
        await runner.cleanup()


def test_arrival_rules_vllm_style_stream():
    # role announcement + first token together, an empty-text token (held-back UTF-8), text, and
    # an empty closing chunk carrying only finish_reason (not a token)
    script = [(0.05, chat(role=True, content="") + chat("a")), (0.05, chat("")), (0.05, chat("b")),
              (0.05, chat("", finish="length")), (0.0, usage(3) + "data: [DONE]\n\n")]
    res, times = asyncio.run(run(script, max_tokens=3))
    t = res.timing
    assert t.error is None and res.finish_reason == "length"
    assert t.output_tokens == 3 and t.prompt_tokens == 7 and not t.short  # counts from usage
    assert len(times) == 3  # "a", "", "b"
    assert t.first_token == times[0] and t.last_token == times[-1]
    # the script's sleeps never end early, a loaded box only makes them late: bounded below (which
    # chunks are the first and last token is the identity with `times` above)
    assert t.last_token - t.first_token >= 0.10 - 0.005
    assert t.ttft >= 0.05 - 0.005


def test_single_empty_token_still_gives_a_first_token_time():
    res, times = asyncio.run(run([(0.05, chat("", finish="length") + usage(1) + "data: [DONE]\n\n")],
                                 max_tokens=1))
    assert res.timing.error is None and res.timing.ttft is not None and len(times) == 1


def test_messages_split_across_reads_and_spaced_json():
    one, two = chat("x", compact=False), chat("y", finish="length", compact=False)
    script = [(0.02, one[:17]), (0.02, one[17:] + two[:5]), (0.02, two[5:]), (0.0, usage(2)),
              (0.0, "data: [DONE]\n\n")]
    res, times = asyncio.run(run(script, max_tokens=2))
    assert res.timing.error is None and res.timing.output_tokens == 2 and len(times) == 2


def test_short_output_and_missing_usage():
    res, _ = asyncio.run(run([(0.01, chat("x")), (0.01, chat("y", finish="stop")), (0, "data: [DONE]\n\n")],
                             max_tokens=10))
    assert not res.usage_reported and res.timing.output_tokens == 2  # falls back to counted arrivals
    assert res.timing.short and res.finish_reason == "stop"


def test_errors_are_recorded_not_raised():
    res, _ = asyncio.run(run([(0.01, chat("x"))], max_tokens=10))  # ends without finish or [DONE]
    assert "stream ended early" in res.timing.error
    # the second chunk comes 1 s later: twice the read timeout, on the one event loop of client and script
    res, _ = asyncio.run(run([(0.01, chat("x")), (1.0, chat("y"))], read=0.5, max_tokens=10))
    assert res.timing.error == "timed out: no data for 0.5s"
    res, _ = asyncio.run(run([], api="completions"))
    assert res.timing.error == "HTTP 400: max_tokens is too large"


def test_stream_delivered_in_one_burst_is_flagged_bunched():
    burst = "".join(chat("t") for _ in range(29)) + chat("t", finish="length")
    res, times = asyncio.run(run([(0.05, burst + usage(30) + "data: [DONE]\n\n")], max_tokens=30))
    assert res.timing.output_tokens == 30 and res.arrivals == 1 and res.bunched
    steady = [(0.005, chat("t")) for _ in range(29)] + [(0.005, chat("t", finish="length") + usage(30)),
                                                        (0, "data: [DONE]\n\n")]
    res, _ = asyncio.run(run(steady, max_tokens=30))
    assert res.arrivals > 20 and not res.bunched


async def _closing_server(close_first: int):
    """A raw HTTP server that closes the first `close_first` connections without a response (as a
    server does with a kept-alive connection it has timed out), then serves one short stream."""
    seen = 0
    body = (chat("t") + chat("", finish="length") + usage(1) + "data: [DONE]\n\n").encode()

    async def handle(reader, writer):
        nonlocal seen
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        seen += 1
        if seen > close_first:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                         % len(body) + body)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", lambda: seen


@pytest.mark.parametrize("close_first, ok", [(1, True), (2, False)])
def test_request_on_a_connection_the_server_closed_is_retried_once(close_first, ok):
    async def main():
        server, url, seen = await _closing_server(close_first)
        try:
            async with OpenAIStreamClient(url, "m", timeouts=Timeouts(2, 5, 10)) as c:
                return await c.stream("hi", 1), seen()
        finally:
            server.close()
    res, attempts = asyncio.run(main())
    assert attempts == 2
    if ok:
        assert res.timing.error is None and res.timing.output_tokens == 1
    else:
        assert res.timing.error == "server closed the connection"
