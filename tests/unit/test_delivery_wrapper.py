"""The delivery wrapper (hooks/delivery.py) hands a client's hang-up to vLLM at once.

vLLM aborts a request when its `AsyncLLM.generate` stream sees CancelledError (the handler's task is
cancelled while it waits for the next output) or GeneratorExit (the stream is closed while suspended
at a yield: merge_async_iterators' `finally`, or the event loop's finalizer).  The wrapper stands
between the two, so each must reach vLLM's generator before the consumer's cancel or close returns.
vLLM's generator is faked here at that one seam, with its except clause as it is in 0.26-0.34 (an
await before the abort is sent); the served path is tests/integration/test_exporter_e2e.py's.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from vllm_spark_plugin.hooks import delivery


class Engine:
    def __init__(self):
        self.outputs: asyncio.Queue = asyncio.Queue()
        self.aborted: list[str] = []

    def put(self, tokens: int, finished: bool = False) -> None:
        self.outputs.put_nowait(SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * tokens)],
                                                finished=finished, metrics=None))


async def vllm_generate(self, prompt, sampling_params, request_id="r"):
    try:
        while True:
            out = await self.outputs.get()
            yield out
            if out.finished:
                return
    except (asyncio.CancelledError, GeneratorExit):
        await asyncio.sleep(0)  # vLLM: `await self.abort(request_id)`
        self.aborted.append(request_id)
        raise


@pytest.fixture
def wrapped(monkeypatch):
    delivered = []
    monkeypatch.setattr(delivery, "_ORIGINAL", vllm_generate)
    monkeypatch.setattr(delivery, "_sink", delivered.append)
    monkeypatch.setattr(delivery, "_feedback", None)
    return delivered


def test_a_handler_cancelled_while_it_waits_aborts_the_request(wrapped):
    async def main():
        engine, got = Engine(), []

        async def handler():
            async for out in delivery.generate(engine, "p", SimpleNamespace(output_kind=None)):
                got.append(out)

        task = asyncio.create_task(handler())
        engine.put(1)
        while not got:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return list(engine.aborted), got

    aborted, got = asyncio.run(main())
    assert aborted == ["r"] and len(got) == 1
    assert wrapped == []  # an abandoned stream is no finished one


def test_a_stream_closed_at_its_yield_aborts_the_request_before_the_close_returns(wrapped):
    async def main():
        engine = Engine()
        stream = delivery.generate(engine, "p", SimpleNamespace(output_kind=None))
        engine.put(1)
        first = await stream.__anext__()
        await stream.aclose()  # the consumer left while the wrapper sat at `yield`
        return list(engine.aborted), first

    aborted, first = asyncio.run(main())
    assert aborted == ["r"] and first.finished is False
    assert wrapped == []


def test_a_stream_run_to_its_end_is_delivered_and_not_aborted(wrapped):
    async def main():
        engine = Engine()
        for tokens, finished in ((1, False), (2, False), (1, True)):
            engine.put(tokens, finished)
        return engine.aborted, [out async for out in delivery.generate(engine, "p", SimpleNamespace(output_kind=None))]

    aborted, outs = asyncio.run(main())
    assert aborted == [] and len(outs) == 3
    assert [r.output_tokens for r in wrapped] == [4]
