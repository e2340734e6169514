"""Streaming client for OpenAI-compatible completions and chat endpoints.

Timing follows the seed definitions: every SSE chunk that carries generated output is a token
arrival, and the first and last such chunks give the first- and last-token times; the token count
comes from the server's `usage` (requested with `stream_options: {include_usage: true}`).  A chunk
carries output when it has text, or when it is an empty-text chunk in mid-stream (vLLM sends one per
token whose text the detokenizer holds back, e.g. part of a multi-byte character).  Not counted: the
chat role announcement (`delta: {role: assistant, content: ""}`) and an empty closing chunk that
only carries `finish_reason` after output has arrived.  Per chunk the client does the
minimum (one `json.loads`, two comparisons), so that the client is never the bottleneck it measures.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from ..definitions import StreamTiming
from .workloads import Prompt

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class StreamResult:
    """One streamed request: the seed-definition timing plus what the scenarios need."""

    timing: StreamTiming
    chunk_times: list[float] | None = None  # arrival time of each token-carrying chunk (when asked)
    finish_reason: str | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    usage_reported: bool = True
    arrivals: int = 0  # distinct reads that delivered tokens

    @property
    def ok(self) -> bool:
        return self.timing.error is None

    @property
    def bunched(self) -> bool:
        """Delivered in a few bursts (the server held its output back, e.g. a CPU-starved API
        server): first/last token times then say nothing about the decode rate."""
        return is_bunched(self.timing.output_tokens, self.arrivals)


BUNCHED_MIN_TOKENS = 20
BUNCHED_ARRIVAL_FRACTION = 0.10
# Where only chunk timestamps are known (not reads), chunks closer than this count as one arrival.
ARRIVAL_GAP_SECONDS = 0.0005


def is_bunched(output_tokens: int, arrivals: int) -> bool:
    """At least 20 tokens arrived in fewer than 10% as many distinct reads.  (Speculative decoding
    delivers a few tokens per chunk; a stream in 2-3 bursts is something else.)"""
    return output_tokens >= BUNCHED_MIN_TOKENS and arrivals < BUNCHED_ARRIVAL_FRACTION * output_tokens


@dataclass(frozen=True)
class Timeouts:
    connect: float = 10.0   # TCP connect
    read: float = 120.0     # longest silence within a request (before headers or between chunks)
    total: float = 3600.0   # whole request

    def client_timeout(self) -> aiohttp.ClientTimeout:
        # No aiohttp sock_read: it re-arms a timer on every read (heap churn that costs more CPU than
        # the parsing); one watchdog per client checks every stream's last activity instead.
        return aiohttp.ClientTimeout(total=self.total, sock_connect=self.connect)


class _Live:
    """An in-flight request as the watchdog sees it."""

    __slots__ = ("last", "task", "timed_out")

    def __init__(self, now: float, task: asyncio.Task | None) -> None:
        self.last = now
        self.task = task
        self.timed_out = False


def normalize_endpoint(url: str) -> str:
    """'host:8000', 'http://host:8000/', 'http://host:8000/v1' -> 'http://host:8000'."""
    u = url.strip()
    if not u:
        raise ValueError("empty endpoint URL")
    if "://" not in u:
        u = "http://" + u
    u = u.rstrip("/")
    if u.endswith("/v1"):
        u = u[:-3]
    return u


def describe_error(exc: BaseException, timeouts: Timeouts) -> str:
    """A short, specific message for a failed request."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        why = ("connection refused" if isinstance(exc.os_error, ConnectionRefusedError)
               else exc.os_error.strerror or str(exc.os_error))
        return f"cannot connect to {exc.host}:{exc.port} ({why})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "server broke off the stream"
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return (f"timed out (no connection within {timeouts.connect:g}s, or the request took over "
                f"{timeouts.total:g}s)")
    if isinstance(exc, aiohttp.ClientError):
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"


class OpenAIStreamClient:
    """Sends streaming requests to one endpoint and model; one aiohttp session per client."""

    def __init__(self, endpoint: str, model: str, api: str = "chat", ignore_eos: bool = True,
                 timeouts: Timeouts | None = None, api_key: str | None = None,
                 extra_body: dict | None = None, disable_thinking: bool = True,
                 max_connections: int = 0) -> None:
        if api not in API_PATHS:
            raise ValueError(f"unknown API {api!r}; choose from {', '.join(API_PATHS)}")
        self.endpoint = normalize_endpoint(endpoint)
        self.model = model
        self.api = api
        self.url = self.endpoint + API_PATHS[api]
        self.ignore_eos = ignore_eos
        self.timeouts = timeouts or Timeouts()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra_body = dict(extra_body or {})
        self.disable_thinking = disable_thinking
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "OpenAIStreamClient":
        # Idle connections are dropped before uvicorn's 5 s keep-alive timeout (vLLM's default) ends them.
        connector = aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300, keepalive_timeout=4)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeouts.client_timeout(),
                                              headers=self.headers, auto_decompress=False)
        self._live: set[_Live] = set()
        self._watchdog_task = asyncio.create_task(self._watchdog())
        return self

    async def __aexit__(self, *exc) -> None:
        self._watchdog_task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _watchdog(self) -> None:
        """Cancel requests silent for longer than the read timeout (they then report a timeout)."""
        period = max(0.05, min(1.0, self.timeouts.read / 4))
        while True:
            await asyncio.sleep(period)
            now = time.perf_counter()
            for live in list(self._live):
                if not live.timed_out and now - live.last > self.timeouts.read and live.task is not None:
                    live.timed_out = True
                    live.task.cancel()

    @property
    def token_ids_allowed(self) -> bool:
        """Token-id prompts work on the completions API only."""
        return self.api == "completions"

    def payload(self, prompt: Prompt, max_tokens: int, temperature: float) -> dict:
        body: dict = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature,
                      "stream": True, "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM extension: outputs are exactly as long as requested
        if self.api == "chat":
            if not isinstance(prompt, str):
                raise ValueError("the chat API takes text prompts, not token ids")
            body["messages"] = [{"role": "user", "content": prompt}]
            if self.disable_thinking:
                body["chat_template_kwargs"] = {"enable_thinking": False}  # seed 003: reasoning off
        else:
            body["prompt"] = prompt
        body.update(self.extra_body)
        return body

    async def _post(self, body: bytes) -> aiohttp.ClientResponse:
        """POST `body`; retried once when the server had already closed the kept-alive connection
        it went out on (the request never reached the server: no response began)."""
        try:
            return await self._session.post(self.url, data=body, headers={"Content-Type": "application/json"})
        except aiohttp.ServerDisconnectedError:
            return await self._session.post(self.url, data=body, headers={"Content-Type": "application/json"})

    async def stream(self, prompt: Prompt, max_tokens: int, temperature: float = 0.0,
                     chunk_times: list[float] | None = None,
                     start_event: asyncio.Event | None = None) -> StreamResult:
        """Send one request and time its stream.  Never raises for request failures: the error is
        recorded in the result (`timing.error`); cancellation propagates.

        `chunk_times`, when given, receives the arrival time of every token-carrying chunk (the
        caller owns the list, so it can watch a running stream and keeps it after cancelling it).
        `start_event` holds the request back (after its payload is built) until the event is set."""
        assert self._session is not None, "use `async with OpenAIStreamClient(...)`"
        body = json.dumps(self.payload(prompt, max_tokens, temperature)).encode()
        if start_event is not None:
            await start_event.wait()
        chat = self.api == "chat"
        key = b'"content":"' if chat else b'"text":"'
        klen = len(key)
        times = chunk_times
        first = last = None
        chunks = reads = 0  # token-carrying chunks, and the distinct reads that delivered them
        usage: dict | None = None
        finish = None
        error = None
        clock = time.perf_counter
        start = clock()
        live = _Live(start, asyncio.current_task())
        self._live.add(live)
        try:
            async with await self._post(body) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    error = f"HTTP {resp.status}: {_error_message(text)}"
                else:
                    buf = b""
                    done = False
                    async for data in resp.content.iter_any():
                        now = clock()
                        live.last = now
                        if buf:
                            data, buf = buf + data, b""
                        if not data.endswith(b"\n\n"):
                            cut = data.rfind(b"\n\n")
                            if cut < 0:
                                buf = data
                                continue
                            data, buf = data[:cut + 2], data[cut + 2:]
                        for msg in data.split(b"\n\n"):
                            if not msg.startswith(b"data:"):
                                continue  # the empty tail of the split, SSE comments, keep-alives
                            payload = msg[5:].lstrip()
                            # Fast path for the common chunk (compact JSON, one choice, no usage):
                            # byte checks instead of a full parse.
                            i = payload.find(key)
                            if (i >= 0 and b'"usage":{' not in payload and b'"error"' not in payload
                                    and b'"reasoning' not in payload):
                                j = payload.find(b'"finish_reason":"')
                                if j >= 0:
                                    finish = payload[j + 17:payload.index(b'"', j + 17)].decode()
                                arrived = (payload[i + klen] != 34  # text is not an empty string
                                           or (first is None or j < 0) and not (chat and b'"role"' in payload))
                            elif payload == b"[DONE]":
                                done = True
                                continue
                            else:
                                arrived = False
                                obj = json.loads(payload)
                                choices = obj.get("choices")
                                if choices:
                                    c = choices[0]
                                    if chat:
                                        d = c.get("delta") or {}
                                        text = d.get("content") or d.get("reasoning_content") or d.get("reasoning")
                                        announce = "role" in d
                                    else:
                                        text, announce = c.get("text"), False
                                    if c.get("finish_reason"):
                                        finish = c["finish_reason"]
                                    arrived = bool(text) or (first is None or not c.get("finish_reason")) and not announce
                                if obj.get("usage"):
                                    usage = obj["usage"]
                                if "error" in obj and not choices:
                                    error = f"server error in stream: {_error_message(json.dumps(obj['error']))}"
                            if arrived:
                                chunks += 1
                                if last != now:
                                    reads += 1
                                if first is None:
                                    first = now
                                last = now
                                if times is not None:
                                    times.append(now)
                    if error is None and not done and finish is None:
                        error = f"stream ended early after {chunks} chunks (no finish_reason, no [DONE])"
        except asyncio.CancelledError:
            if not live.timed_out:
                raise
            uncancel = getattr(live.task, "uncancel", None)
            if uncancel is not None:
                uncancel()
            error = f"timed out: no data for {self.timeouts.read:g}s"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            error = describe_error(exc, self.timeouts)
        finally:
            self._live.discard(live)
        if usage is not None:
            out_tokens = int(usage.get("completion_tokens") or 0)
            prompt_tokens = int(usage.get("prompt_tokens") or 0)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        else:
            out_tokens, prompt_tokens, cached = chunks, 0, None
        timing = StreamTiming(output_tokens=out_tokens, start=start, first_token=first, last_token=last,
                              prompt_tokens=prompt_tokens, requested_tokens=max_tokens, error=error)
        return StreamResult(timing=timing, chunk_times=times, finish_reason=finish, cached_tokens=cached,
                            usage_reported=usage is not None, arrivals=reads)


def _error_message(text: str) -> str:
    """The `message` of an OpenAI-style error body, else the text itself (shortened)."""
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            if isinstance(err, dict) and err.get("message"):
                return str(err["message"])[:300]
            if obj.get("message"):
                return str(obj["message"])[:300]
    except ValueError:
        pass
    return text.strip()[:300] or "(empty body)"
