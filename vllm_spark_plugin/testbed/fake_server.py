"""A fake OpenAI-compatible streaming server with a batching engine of known timing (test support
and the load target of `benchmarks/client_overhead.py`; it stands in for a GPU server only where
the real one cannot run or would hide what a test checks, e.g. exact known step times or dying on
command).

Engine model (the step-time model of the seeds): one loop runs decode steps; a step with b running
requests takes `alpha + beta*b` seconds, plus `prefill_per_token` for every uncached prompt token
of the requests that join in that step, and gives every running request one token.  So a stream's
decode rate in a batch of b is exactly 1/(alpha + beta*b), the aggregate is b/(alpha + beta*b), the
knee is alpha/beta, and a long uncached prompt stalls every running stream for its prefill (the
prefill-interference scenario).  A prompt seen before costs no prefill (prefix cache).

Endpoints: POST /v1/completions and /v1/chat/completions (SSE streaming, `usage` chunk when
`stream_options.include_usage`; non-streaming too), GET /v1/models, /version, /health, /metrics (with
`vllm:cache_config_info` and `vllm_spark_info` lines), POST /tokenize.

Clocks: by default the engine runs on the event loop's clock (`LoopClock`: a step takes real time,
as a client on the wall clock expects).  With `FakeServer(cfg, clock=SimulatedClock())` time is
simulated and the test controls it: nothing happens until `clock.advance(seconds)`, every step then
ends exactly at its scheduled time however late the machine runs it, and the server records each
request's arrival and token times on that clock (`server.timings`), so timing assertions on it are
exact.

Use in-process (`FakeServer(FakeConfig(...)).start()` runs it on a thread) or as a process:
`python -m vllm_spark_plugin.testbed.fake_server --port 0` prints its URL on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from aiohttp import web


@dataclass
class FakeConfig:
    model: str = "fake-model"
    version: str = "0.0.0-fake"
    max_model_len: int = 8192
    alpha: float = 0.010              # fixed cost of a step (s)
    beta: float = 0.0005              # cost per running request per step (s)
    prefill_per_token: float = 0.0    # cost per uncached prompt token joining a step (s)
    prefix_cache: bool = True
    tokens_per_chunk: int = 1         # tokens per SSE chunk (>1 mimics speculative decoding)
    eos_after: int | None = None      # without ignore_eos, a request stops after this many tokens
    die_after_requests: int | None = None  # the server dies when request number N+1 arrives
    stall_after_tokens: int | None = None  # streams go silent (a hung server) after this many tokens
    max_batch: int = 4096             # requests beyond this wait (queueing shows in TTFT)
    extra_metrics: str = ""           # Prometheus text appended to /metrics (e.g. a live capacity)
    vocab: int = 512
    host: str = "127.0.0.1"
    port: int = 0


class LoopClock:
    """The event loop's clock: a step takes real time.  A step that ends late (a busy machine) moves
    the schedule on from there instead of catching up in a burst."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def started(self, since: float) -> float:
        """The first step after a wake starts now."""
        return self.now()

    @staticmethod
    def admits(arrived: float, step_start: float) -> bool:
        """Whether a waiting request joins the step starting now: always, on the wall clock."""
        return True

    async def sleep_until(self, t: float) -> float:
        """Sleep until `t`; returns when the step really ended."""
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)
            return t
        return self.now()


class SimulatedClock:
    """Simulated time that the test moves with `advance` (from any thread).

    The engine waits for simulated time to reach the end of each step, and a step ends exactly at its
    scheduled time.  An engine woken by new requests starts its first step at the first request's
    arrival, once an `advance` has moved past it, so every request that arrived at that instant joins
    that step however late the engine wakes."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        # (condition on the time, the waiter's loop, its future)
        self._waiters: list[tuple[Callable[[float], bool], asyncio.AbstractEventLoop, asyncio.Future]] = []

    def now(self) -> float:
        return self._now

    async def started(self, since: float) -> float:
        """The first step after a wake starts at `since` (the first request's arrival), once simulated
        time has moved past it: at once if an `advance` already did, since on a busy machine the engine
        may wake only after the test saw the request arrive and advanced the clock."""
        await self._wait(lambda now: now > since)
        return since

    @staticmethod
    def admits(arrived: float, step_start: float) -> bool:
        """A request joins a step only if it arrived by the step's start (however late the machine
        runs the step)."""
        return arrived <= step_start

    async def sleep_until(self, t: float) -> float:
        await self._wait(lambda now: now >= t)
        return t

    async def _wait(self, ready: Callable[[float], bool]) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if ready(self._now):
                return
            fut = loop.create_future()
            self._waiters.append((ready, loop, fut))
        await fut

    def advance(self, seconds: float) -> float:
        """Move simulated time on by `seconds`; every step due by then runs.  Returns the new time."""
        if not seconds > 0:
            raise ValueError(f"advance by a positive time, not {seconds!r}")
        with self._lock:
            self._now += seconds
            due = [w for w in self._waiters if w[0](self._now)]
            self._waiters = [w for w in self._waiters if not w[0](self._now)]
        for _, loop, fut in due:
            loop.call_soon_threadsafe(_resolve, fut)
        return self._now


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass
class RequestTimings:
    """One request as the fake's engine served it, on the server's clock."""

    arrived: float
    prompt_tokens: int
    token_times: list[float] = field(default_factory=list)  # one entry per generated token


class _Req:
    __slots__ = ("resp", "target", "emitted", "chat", "head", "prompt_tokens", "uncached", "finish",
                 "done", "pending", "role_sent", "transport", "include_usage", "timings", "arrived")

    def __init__(self, resp, target, chat, head, prompt_tokens, uncached, finish, done, transport,
                 include_usage, arrived, timings=None):
        self.resp = resp
        self.target = target
        self.emitted = 0
        self.chat = chat
        self.head = head
        self.prompt_tokens = prompt_tokens
        self.uncached = uncached
        self.finish = finish
        self.done = done
        self.pending = 0
        self.role_sent = False
        self.transport = transport
        self.include_usage = include_usage
        self.timings = timings
        self.arrived = arrived


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def fake_token_ids(text: str, vocab: int) -> list[int]:
    """Deterministic 'tokenization': one token per whitespace-separated word."""
    return [10 + zlib.crc32(w.encode()) % (vocab - 10) for w in text.split()]


class FakeServer:
    def __init__(self, config: FakeConfig | None = None, clock: LoopClock | SimulatedClock | None = None) -> None:
        self.cfg = config or FakeConfig()
        self.clock = clock or LoopClock()
        # Per-request timings on `clock`, by request id (cmpl-N / chatcmpl-N): kept under a simulated
        # clock only (a load run on the wall clock would grow it without bound).
        self.timings: dict[str, RequestTimings] = {}
        self._record = isinstance(self.clock, SimulatedClock)
        # Every engine step as (running streams, prompt tokens prefilled, seconds): what the plugin's
        # scheduler hook hands the online knee estimator; kept under a simulated clock only.
        self.steps: list[tuple[int, int, float]] = []
        self.requests_seen = 0
        self.dead = False
        self.max_batch_seen = 0
        self._running: list[_Req] = []
        self._waiting: collections.deque[_Req] = collections.deque()
        self._seen_prompts: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._wake: asyncio.Event | None = None
        self._engine_task: asyncio.Task | None = None
        self.port = self.cfg.port

    # ------------------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def start_async(self) -> "FakeServer":
        self._wake = asyncio.Event()
        self._engine_task = asyncio.create_task(self._engine())
        # A fake's requests may hang on purpose (stall_after_tokens): stopping waits 1 s for them, not 60.
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, backlog=1024)
        await self._site.start()
        self.port = self._site._server.sockets[0].getsockname()[1]  # the port chosen for port 0
        return self

    async def stop_async(self) -> None:
        if self._engine_task:
            self._engine_task.cancel()
        for r in list(self._running) + list(self._waiting):  # their handlers return now
            if not r.done.done():
                r.done.set_result(False)
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> "FakeServer":
        """Run on a background thread with its own event loop; returns when it is listening."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self.start_async())
            except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self.stop_async())
            self._loop.close()

        self._thread = threading.Thread(target=main, name="fake-openai-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop and self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def die(self) -> None:
        """Die like a killed process: stop listening and cut every open connection (thread-safe)."""
        if self._loop and threading.current_thread() is not self._thread:
            done = threading.Event()
            self._loop.call_soon_threadsafe(lambda: (self._die(), done.set()))
            done.wait(5)
        else:
            self._die()

    def _die(self) -> None:
        self.dead = True
        if self._site is not None and self._site._server is not None:
            self._site._server.close()  # no new connections: clients get "connection refused"
        if self._runner is not None and self._runner.server is not None:
            for handler in self._runner.server.connections:
                if handler.transport is not None:
                    handler.transport.abort()
        for r in list(self._running) + list(self._waiting):
            if r.transport is not None:
                r.transport.abort()
            if not r.done.done():
                r.done.set_result(False)
        self._running.clear()
        self._waiting.clear()

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def in_flight(self) -> int:
        """Requests the engine holds (running or waiting)."""
        return len(self._running) + len(self._waiting)

    # ------------------------------------------------------------------------------ engine
    async def _engine(self) -> None:
        clock = self.clock
        cfg = self.cfg
        next_t = clock.now()
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                next_t = await clock.started(self._waiting[0].arrived if self._waiting else clock.now())
            joining = []
            while (self._waiting and len(self._running) + len(joining) < cfg.max_batch
                   and clock.admits(self._waiting[0].arrived, next_t)):
                joining.append(self._waiting.popleft())
            batch = self._running + joining
            self.max_batch_seen = max(self.max_batch_seen, len(batch))
            prefill = sum(r.uncached for r in joining)
            step = cfg.alpha + cfg.beta * len(batch) + cfg.prefill_per_token * prefill
            if self._record:
                self.steps.append((len(batch), prefill, step))
            next_t = await clock.sleep_until(next_t + step)
            if self.dead:
                continue
            keep = []
            stall = cfg.stall_after_tokens
            for r in batch:
                if r.done.done():
                    continue
                if r.transport is not None and r.transport.is_closing():  # the client went away
                    r.done.set_result(False)
                    continue
                if stall is not None and r.emitted >= stall:
                    keep.append(r)  # hung: in the batch, never another token
                    continue
                if await self._emit(r, next_t):
                    keep.append(r)
            self._running = keep

    async def _emit(self, r: _Req, now: float) -> bool:
        """One token for `r` at `now`; writes a chunk every `tokens_per_chunk` tokens.  False when finished."""
        r.emitted += 1
        if r.timings is not None:
            r.timings.token_times.append(now)
        r.pending += 1
        last = r.emitted >= r.target
        try:
            if r.resp is not None and (r.pending >= self.cfg.tokens_per_chunk or last):
                if r.chat and not r.role_sent:
                    r.role_sent = True
                    await r.resp.write(b'data: {' + r.head + b',"choices":[{"index":0,"delta":{"role":"assistant",'
                                       b'"content":""},"logprobs":null,"finish_reason":null}]}\n\n')
                text = " tok" * r.pending
                fin = b'"' + r.finish.encode() + b'"' if last else b"null"
                if r.chat:
                    body = b',"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"},"logprobs":null,"finish_reason":' + fin + b"}]}"
                else:
                    body = b',"choices":[{"index":0,"text":"' + text.encode() + b'","logprobs":null,"finish_reason":' + fin + b"}]}"
                await r.resp.write(b"data: {" + r.head + body + b"\n\n")
                r.pending = 0
        except (ConnectionError, RuntimeError):  # the client went away: drop the request
            if not r.done.done():
                r.done.set_result(False)
            return False
        if last:
            if not r.done.done():
                r.done.set_result(True)
            return False
        return True

    # ------------------------------------------------------------------------------ handlers
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.cfg.model, "object": "model", "created": 0, "owned_by": "fake",
             "root": self.cfg.model, "max_model_len": self.cfg.max_model_len}]})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.cfg.version})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        text = ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                "# TYPE vllm:cache_config_info gauge\n"
                'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="'
                f'{self.cfg.prefix_cache}",gpu_memory_utilization="0.5",num_gpu_blocks="1000"}} 1.0\n'
                "# TYPE vllm_spark_info gauge\n"
                f'vllm_spark_info{{device="fake",model_name="{self.cfg.model}",moe_backend="none",'
                f'plugin_version="0.0",vllm_version="{self.cfg.version}"}} 1.0\n'
                f"vllm:num_requests_running{{model_name=\"{self.cfg.model}\"}} {len(self._running)}.0\n"
                + self.cfg.extra_metrics)
        return web.Response(text=text, content_type="text/plain")

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = fake_token_ids(str(body.get("prompt", "")), self.cfg.vocab)
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.cfg.max_model_len})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        self.requests_seen += 1
        if self.dead or (self.cfg.die_after_requests is not None
                         and self.requests_seen > self.cfg.die_after_requests):
            self._die()  # cuts this connection too: the client sees the server vanish
            return web.Response(status=500)
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if body.get("model") != self.cfg.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return _error(400, "messages must be a non-empty list")
            text = "\n".join(str(m.get("content", "")) for m in msgs)
            prompt_key = zlib.crc32(text.encode())
            prompt_tokens = len(text.split())
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                prompt_tokens = len(prompt)
                prompt_key = hash(tuple(prompt))
            elif isinstance(prompt, str):
                prompt_tokens = len(prompt.split())
                prompt_key = zlib.crc32(prompt.encode())
            else:
                return _error(400, "prompt must be a string or a list of token ids")
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if prompt_tokens + max_tokens > self.cfg.max_model_len:
            return _error(400, f"This model's maximum context length is {self.cfg.max_model_len} tokens. "
                               f"However, you requested {prompt_tokens + max_tokens} tokens.")
        cached = self.cfg.prefix_cache and prompt_key in self._seen_prompts
        self._seen_prompts.add(prompt_key)
        target, finish = max_tokens, "length"
        if not body.get("ignore_eos") and self.cfg.eos_after is not None and self.cfg.eos_after < max_tokens:
            target, finish = self.cfg.eos_after, "stop"
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.requests_seen}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (f'"id":"{rid}","object":"{obj}","created":{int(time.time())},"model":"{self.cfg.model}"').encode()
        streaming = bool(body.get("stream"))
        include_usage = streaming and bool((body.get("stream_options") or {}).get("include_usage"))
        resp = None
        if streaming:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
        done = asyncio.get_running_loop().create_future()
        arrived = self.clock.now()
        timings = None
        if self._record:
            timings = self.timings[rid] = RequestTimings(arrived=arrived, prompt_tokens=prompt_tokens)
        req = _Req(resp, target, chat, head, prompt_tokens, 0 if cached else prompt_tokens, finish, done,
                   request.transport, include_usage, arrived, timings)
        self._waiting.append(req)
        self._wake.set()
        ok = await done
        if not ok:
            return resp if resp is not None else _error(500, "aborted")
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": target,
                 "total_tokens": prompt_tokens + target,
                 "prompt_tokens_details": {"cached_tokens": prompt_tokens if cached else 0}}
        if not streaming:
            choice = ({"index": 0, "message": {"role": "assistant", "content": " tok" * target},
                       "finish_reason": finish} if chat else
                      {"index": 0, "text": " tok" * target, "finish_reason": finish})
            return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                      "model": self.cfg.model, "choices": [choice], "usage": usage})
        try:
            if include_usage:
                await resp.write(b"data: {" + head + b',"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m vllm_spark_plugin.testbed.fake_server",
                                description="fake OpenAI-compatible streaming server with a batching engine")
    for f in fields(FakeConfig):
        kind = {"int | None": int, "int": int, "float": float, "bool": lambda s: s.lower() in ("1", "true", "yes"),
                "str": str}[str(f.type)]
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(argv)
    cfg = FakeConfig(**{f.name: getattr(args, f.name) for f in fields(FakeConfig)})

    async def serve() -> None:
        server = await FakeServer(cfg).start_async()
        print(f"fake OpenAI server listening on {server.base_url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop_async()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
