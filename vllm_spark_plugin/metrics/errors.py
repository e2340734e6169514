"""Failure containment: plugin errors are counted, logged once per kind, and never reach vLLM."""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("vllm_spark_plugin")

_seen: set[tuple[str, str]] = set()
_lock = threading.Lock()
_counter = None  # prometheus Counter, set by instruments once created
_pending: dict[str, int] = {}  # errors seen before the counter existed


def bind_counter(counter) -> None:
    global _counter
    with _lock:
        _counter = counter
        for where, n in _pending.items():
            counter.labels(where=where).inc(n)
        _pending.clear()


def report(where: str, exc: BaseException | str) -> None:
    """Count one contained error under `where`; log the first of each (where, kind). Never raises."""
    try:
        kind = exc if isinstance(exc, str) else type(exc).__name__
        with _lock:
            first = (where, kind) not in _seen
            if first:
                _seen.add((where, kind))
            if _counter is None:
                _pending[where] = _pending.get(where, 0) + 1
        if _counter is not None:
            _counter.labels(where=where).inc()
        if first:
            log.warning("vllm-spark-plugin: contained error in %s (%s): %s; counted in "
                        "vllm_spark_plugin_errors_total, further ones are not logged",
                        where, kind, exc, exc_info=not isinstance(exc, str))
    except Exception:  # the last line of defence must not fail either
        pass
