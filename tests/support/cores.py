"""A core of its own for a test client that times a real server's streams.

On a 2-core box a client sharing the cores with vLLM is starved and reads its streams in bursts (a
median rate of 14,459 tok/s was read from a server doing about 100; docs/testing.md, "Clients on
their own core"): its timings then measure its own lateness, and how late depends on whatever else the box runs.  While
it measures, the client's thread runs alone on the last core and every thread of the server's
process group on the others (vLLM's CPU worker already binds its compute to the first core), so a
loaded machine slows the server but cannot make the client read late.  Priority (testbed/server.py's
prioritize_client) cannot do this alone: a busy-polling engine core at normal priority still takes
the client's core between its reads.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _group_threads(pgid: int) -> list[int]:
    """Every thread of every process in the process group `pgid` (a server started in a session of its
    own: the API servers, the engine core and its workers)."""
    tids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # after the command: state, ppid, pgrp
                tids += [int(t.name) for t in (stat.parent / "task").iterdir()]
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while we looked
    return tids


@contextlib.contextmanager
def client_core(server):
    """Pin the calling thread (the client) to the last allowed core and `server`'s process group to the
    rest for the duration; restore both after.  Yields whether it could (it cannot with one core, or
    without the right to move the server's threads): a caller that gates on the client's timings
    needs it."""
    cores = sorted(os.sched_getaffinity(0))
    proc = getattr(server, "proc", None)
    if len(cores) < 2 or proc is None:
        yield False
        return
    client, rest = {cores[-1]}, set(cores[:-1])
    mine = os.sched_getaffinity(0)
    saved: dict[int, set[int]] = {}
    try:
        for tid in _group_threads(os.getpgid(proc.pid)):
            try:
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, rest)
            except OSError:
                saved.pop(tid, None)  # ended, or not ours to move
        os.sched_setaffinity(0, client)
        yield bool(saved)
    finally:
        os.sched_setaffinity(0, mine)
        for tid, mask in saved.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                pass  # ended meanwhile
