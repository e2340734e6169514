"""The delivery clock: wraps `AsyncLLM.generate`, the per-request stream of outputs the OpenAI
server iterates and writes to the client, to time each output where it leaves vLLM for the client
(`metrics.delivery`).  API-server process only; installed by the stat logger, which owns the
exporter the finished requests go to.  Registered in `hooks.PATCHES`.

A request's clock starts when its HTTP request reaches the API server's application: the wrap of
Starlette's ASGI entry (`Starlette.__call__`, the app every vLLM release serves) stamps the arrival in
a context variable that the request's task, and the tasks it starts, carry to `generate`.  So the
time a request waits in an overloaded API server before vLLM sees it counts in its TTFT, as it does
for its client.  Without Starlette (or outside an HTTP request) the clock starts at `generate`.

Per output: one clock read, a token count and two stores; nothing else on the hot path.  No
exception leaves the wrapper except the stream's own (cancellation, engine errors), untouched.
"""
from __future__ import annotations

import contextvars
from time import monotonic

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.hooks import patching
from vllm_spark_plugin.definitions import stream_decode_rate
from vllm_spark_plugin.metrics.delivery import Delivery, FeedbackWriter, not_streamed
from vllm_spark_plugin.vllm import capabilities

PATCH = "delivery_clock"

_ORIGINAL = None
_ORIGINAL_APP_CALL = None
_sink = None  # callable(Delivered), set by install(); None: the wrapper only passes outputs through
_feedback = None  # FeedbackWriter while the guard is on (the engine core reads its file)
_ARRIVAL: contextvars.ContextVar = contextvars.ContextVar("vllm_spark_http_arrival", default=None)


def install(patch, settings, on_error, sink, **_context) -> bool:
    """Wrap AsyncLLM.generate (and stamp HTTP arrivals) once per process; the first sink stays
    (`sink(Delivered)`: one engine's `record_delivered`).  False when the probe fails."""
    global _ORIGINAL, _sink
    if not getattr(capabilities, patch.probe)().ok:
        return False
    if _sink is None:  # one sink per process: the first engine's (data parallel: docs/metrics.md)
        _sink = sink
    if settings.guard_on:
        _start_feedback(settings)
    if _ORIGINAL is not None:
        return True
    _ORIGINAL = patching.replace(PATCH, capabilities.engine_client_class(), "generate", generate)
    _stamp_http_arrivals()
    return True


def _start_feedback(settings) -> None:
    """With the guard on, each finished stream's delivery and engine-clock rates feed the guard's
    feedback file in the run directory (metrics.delivery.FeedbackWriter; docs/guard.md)."""
    global _feedback
    from vllm_spark_plugin.hooks import channel
    directory = channel.run_dir()
    if directory and _feedback is None:
        _feedback = FeedbackWriter(directory, every=max(1.0, settings.knee_refit_seconds / 2))


def _feed_back(result, out) -> None:
    m = getattr(out, "metrics", None)
    first, last = getattr(m, "first_token_ts", None), getattr(m, "last_token_ts", None)
    if isinstance(first, (int, float)) and isinstance(last, (int, float)):
        _feedback.add(result.decode_rate, stream_decode_rate(result.output_tokens, last - first))


def _stamp_http_arrivals() -> None:
    global _ORIGINAL_APP_CALL
    app = capabilities.asgi_app_class()
    if app is None or _ORIGINAL_APP_CALL is not None:
        return
    _ORIGINAL_APP_CALL = patching.replace(PATCH, app, "__call__", app_call)


async def app_call(self, scope, receive, send):
    if scope.get("type") == "http":
        _ARRIVAL.set(monotonic())  # this request's task and its children see it
    return await _ORIGINAL_APP_CALL(self, scope, receive, send)


def _kind(args, kwargs):
    sp = args[1] if len(args) > 1 else kwargs.get("sampling_params")
    return getattr(getattr(sp, "output_kind", None), "name", None)


def _tokens(out) -> int:
    """Tokens in one output (DELTA: the new ones; CUMULATIVE: all so far), summed over sequences."""
    outs = out.outputs
    if len(outs) == 1:  # n=1, the common case: no generator on the hot path
        return len(outs[0].token_ids)
    return sum(len(c.token_ids) for c in outs)


async def generate(self, *args, **kwargs):
    inner = _ORIGINAL(self, *args, **kwargs)
    sink = _sink
    track = None  # None: not timed; False: answered in one piece; else the request's Delivery
    if sink is not None:
        try:
            kind = _kind(args, kwargs)
            start = _ARRIVAL.get() or monotonic()
            track = Delivery(start, cumulative=kind == "CUMULATIVE") if kind != "FINAL_ONLY" else False
        except Exception as exc:
            errors.report("delivery", exc)
    try:
        async for out in inner:
            if track is not None:
                try:
                    if track is False:  # answered in one piece: vLLM's own figures
                        if out.finished:
                            _finish_whole(out, sink)
                    else:
                        track.see(monotonic(), _tokens(out))
                        if out.finished:
                            result = track.result()
                            sink(result)
                            if _feedback is not None:
                                _feed_back(result, out)
                except Exception as exc:
                    errors.report("delivery", exc)
                    track = None
            yield out
    finally:
        await inner.aclose()


def _finish_whole(out, sink) -> None:
    m = getattr(out, "metrics", None)
    tokens = _tokens(out)
    ttft = getattr(m, "first_token_latency", None)
    first, last = getattr(m, "first_token_ts", None), getattr(m, "last_token_ts", None)
    window = last - first if isinstance(first, (int, float)) and isinstance(last, (int, float)) else None
    sink(not_streamed(ttft, window, tokens))
