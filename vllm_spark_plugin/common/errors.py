"""Failure containment: plugin errors are counted, logged once per kind, and never reach vLLM.

The count is `vllm_spark_plugin_errors_total{where}` on the API server's `/metrics`.  A process with
no exporter (the engine core, the workers, the launcher) hands its counts to a spill sink that the
inbound side installs (`hooks.channel`: a file per process), and the API server's exporter adds the
other processes' increments with `absorb()`.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("vllm_spark_plugin")

_seen: set[tuple[str, str]] = set()
_lock = threading.Lock()
_counter = None  # prometheus Counter, set by instruments once created
_pending: dict[str, int] = {}  # errors seen before the counter existed (or in a process without one)
_spill = None  # fn(counts) that publishes _pending for the API server; None: nowhere to send them
_spill_timer: threading.Timer | None = None
SPILL_DELAY_SECONDS = 1.0  # a failure on every engine step rewrites the file at most this often


def bind_counter(counter) -> None:
    global _counter
    with _lock:
        _counter = counter
        for where, n in _pending.items():
            counter.labels(where=where).inc(n)
        _pending.clear()
    if _spill is not None:
        try:
            _spill(None)  # this process exports its own counts from now on: withdraw the spilled ones
        except Exception:
            pass


def set_spill(fn) -> None:
    """`fn(counts)` publishes this process's cumulative counts; `fn(None)` withdraws them."""
    global _spill
    _spill = fn


def _flush_spill() -> None:
    global _spill_timer
    with _lock:
        _spill_timer = None
        counts = dict(_pending) if _counter is None else None
    if counts is not None and _spill is not None:
        try:
            _spill(counts)
        except Exception:
            pass


def _schedule_spill() -> None:
    global _spill_timer
    if _spill is None or _spill_timer is not None:
        return
    _spill_timer = threading.Timer(SPILL_DELAY_SECONDS, _flush_spill)
    _spill_timer.daemon = True
    _spill_timer.start()


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
                _schedule_spill()
        if _counter is not None:
            _counter.labels(where=where).inc()
        if first:
            log.warning("vllm-spark-plugin: contained error in %s (%s): %s; counted in "
                        "vllm_spark_plugin_errors_total, further ones are not logged",
                        where, kind, exc, exc_info=not isinstance(exc, str))
    except Exception:  # the last line of defence must not fail either
        pass


def absorb(spilled: dict[int, dict[str, int]], seen: dict, counter=None) -> int:
    """Add other processes' new errors (cumulative counts by pid) to this process's counter; `seen`
    keeps, per (pid, where), what was added before (one per reader of the spilled counts)."""
    added = 0
    counter = counter if counter is not None else _counter
    if counter is None:
        return added
    for pid, counts in spilled.items():
        for where, total in counts.items():
            before = seen.get((pid, where), 0)
            if total > before:
                counter.labels(where=where).inc(total - before)
                seen[(pid, where)] = total
                added += total - before
    return added
