"""Preflight and metadata: what the server says about itself.

`preflight` fails in seconds with a clear message when the URL is wrong, the server is down or the
model is not served (`GET /v1/models` with a short timeout).  `collect` then reads what a benchmark
record needs (seed 001: engine version, model, recipe settings): `/version`, `max_model_len` from
`/v1/models`, and the `vllm:cache_config_info` / `vllm_spark_info` label sets from `/metrics`.
Everything after preflight is best effort: a server without `/metrics` still gets benchmarked.
"""
from __future__ import annotations

import asyncio
import json
import re
from dataclasses import asdict, dataclass, field

import aiohttp

from .client import describe_error, normalize_endpoint, Timeouts


class PreflightError(RuntimeError):
    """The endpoint cannot be benchmarked (wrong URL, server down, model not served)."""


@dataclass
class ServerInfo:
    endpoint: str
    model: str
    served_models: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    root: str | None = None  # where the server loaded the model from (GET /v1/models `root`)
    engine_version: str | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    spark_info: dict[str, str] = field(default_factory=dict)
    tokenize_available: bool = False

    def recipe(self) -> str:
        """Recipe settings the server reports, as one 'key=value;...' string (CSV-friendly)."""
        keys = ("gpu_memory_utilization", "block_size", "cache_dtype", "enable_prefix_caching",
                "num_gpu_blocks", "kv_cache_memory_bytes")
        parts = [f"{k}={self.cache_config[k]}" for k in keys if self.cache_config.get(k) not in (None, "", "None")]
        parts += [f"{k}={v}" for k, v in sorted(self.spark_info.items())
                  if k not in ("model_name",) and v not in ("", "None")]
        return ";".join(parts)

    def to_json(self) -> dict:
        d = asdict(self)
        d["recipe"] = self.recipe()
        return d


_LABELS = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_info_metric(metrics_text: str, name: str) -> dict[str, str]:
    """Labels of the first sample of an info-style metric (`name{a="x",...} 1`) in Prometheus text."""
    for line in metrics_text.splitlines():
        if line.startswith(name + "{"):
            inner = line[len(name) + 1:line.rfind("}")]
            return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABELS.findall(inner)}
    return {}


async def _get(session: aiohttp.ClientSession, url: str, timeout: float) -> tuple[int, str]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        return resp.status, await resp.text()


async def metrics_text(endpoint: str, timeout: float = 10.0, api_key: str | None = None) -> str | None:
    """The server's /metrics text; None when it cannot be read (best effort)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            status, text = await _get(session, endpoint + "/metrics", timeout)
            return text if status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None


async def preflight(endpoint: str, model: str | None, timeout: float = 5.0,
                    api_key: str | None = None) -> ServerInfo:
    """Check the endpoint answers `GET /v1/models` and serves `model` (the first served model when
    None).  Raises PreflightError with a message naming the URL / model and what went wrong."""
    base = normalize_endpoint(endpoint)
    url = base + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            status, text = await _get(session, url, timeout)
    except asyncio.TimeoutError:
        raise PreflightError(f"{base}: timed out: no answer to GET /v1/models within {timeout:g}s "
                             f"(--connect-timeout); is the server running and is the URL right?") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise PreflightError(f"{base}: {describe_error(exc, Timeouts(connect=timeout, read=timeout, total=timeout))}"
                             f"; is the server running and is the URL right?") from None
    if status == 404:
        raise PreflightError(f"{base}: GET /v1/models returned 404; this is not an OpenAI-compatible "
                             f"endpoint (give the server root, e.g. http://host:8000)")
    if status in (401, 403):
        raise PreflightError(f"{base}: GET /v1/models returned {status}; the server wants an API key (--api-key)")
    if status != 200:
        raise PreflightError(f"{base}: GET /v1/models returned HTTP {status}: {text[:200]}")
    try:
        entries = json.loads(text)["data"]
        served = [str(e["id"]) for e in entries]
    except (ValueError, KeyError, TypeError):
        raise PreflightError(f"{base}: GET /v1/models did not return an OpenAI model list: {text[:200]}") from None
    if not served:
        raise PreflightError(f"{base}: the server serves no model")
    chosen = model or served[0]
    if chosen not in served:
        raise PreflightError(f"{base}: model {chosen!r} is not served here; served: {', '.join(served)}")
    info = ServerInfo(endpoint=base, model=chosen, served_models=served)
    for e in entries:
        if str(e.get("id")) == chosen:
            if isinstance(e.get("max_model_len"), int):
                info.max_model_len = e["max_model_len"]
            if isinstance(e.get("root"), str):
                info.root = e["root"]
    return info


async def collect(info: ServerInfo, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo:
    """Fill in engine version and recipe settings (best effort; nothing here fails the run)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        try:
            status, text = await _get(session, info.endpoint + "/version", timeout)
            if status == 200:
                info.engine_version = str(json.loads(text).get("version") or "") or None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, AttributeError):
            pass
        try:
            status, text = await _get(session, info.endpoint + "/metrics", timeout)
            if status == 200:
                info.cache_config = parse_info_metric(text, "vllm:cache_config_info")
                info.spark_info = parse_info_metric(text, "vllm_spark_info")
                if not info.engine_version and info.spark_info.get("vllm_version"):
                    info.engine_version = info.spark_info["vllm_version"]
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            pass
    return info


async def tokenize(endpoint: str, model: str, text: str, timeout: float = 10.0,
                   api_key: str | None = None) -> list[int] | None:
    """Token ids of `text` from vLLM's `/tokenize` endpoint; None when the server has none."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.post(normalize_endpoint(endpoint) + "/tokenize",
                                    json={"model": model, "prompt": text, "add_special_tokens": False},
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    return None
                tokens = (await resp.json()).get("tokens")
                return [int(t) for t in tokens] if isinstance(tokens, list) else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, TypeError):
        return None


async def reachable(endpoint: str, timeout: float = 3.0, api_key: str | None = None) -> str | None:
    """None when `GET /v1/models` answers 200; else a short reason (used after failed requests to
    tell a dead server from a few bad requests)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            status, _ = await _get(session, normalize_endpoint(endpoint) + "/v1/models", timeout)
        return None if status == 200 else f"GET /v1/models returned HTTP {status}"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return describe_error(exc, Timeouts(connect=timeout, read=timeout, total=timeout))
