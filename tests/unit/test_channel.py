"""The plugin's own channel between vLLM processes: per-step records over a real Unix datagram socket,
and contained errors spilled by a process without an exporter (a real second process)."""
from __future__ import annotations

import threading
import time

import pytest

from vllm_spark_plugin.hooks import channel
from vllm_spark_plugin.metrics.step import LAYOUT, HookStep


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(channel.RUN_DIR_ENV, str(tmp_path))
    return str(tmp_path)


def record(i: int) -> HookStep:
    return HookStep(0, 1000 + i, 0, 0, 4, 4, 100 - i % 7, 101, -1)


class Collect:
    def __init__(self, expected: int) -> None:
        self.records, self.errors, self.invalid = [], [], []
        self.done = threading.Event()
        self.expected = expected

    def on_record(self, fields):
        self.records.append(fields)
        if len(self.records) >= self.expected:
            self.done.set()

    def on_invalid(self, fields):
        self.invalid.append(fields)

    def on_error(self, where, exc):
        self.errors.append((where, exc))

    def reader(self, run_dir, on_record=None):
        return channel.StepReader(run_dir, on_record or self.on_record, self.on_invalid, self.on_error)


def test_records_arrive_in_order_and_batched(run_dir):
    got = Collect(200)
    reader = got.reader(run_dir)
    assert reader.start()
    clock = [0.0]
    writer = channel.StepWriter(run_dir, clock=lambda: clock[0])  # a still clock: batches by count
    for i in range(200):
        writer.add(record(i))
    writer.flush()  # the engine went idle: the last 8 records go now
    assert got.done.wait(10)
    reader.stop()
    assert got.records == [record(i) for i in range(200)]
    assert writer.sent == 200 and writer.dropped == 0 and got.errors == []


def test_a_batch_leaves_after_the_batch_interval(run_dir):
    got = Collect(2)
    reader = got.reader(run_dir)
    assert reader.start()
    clock = [0.0]
    writer = channel.StepWriter(run_dir, clock=lambda: clock[0])
    writer.add(record(0))
    assert writer.sent == 0  # held: neither 64 records nor 50 ms yet
    clock[0] = channel.BATCH_SECONDS
    writer.add(record(1))
    assert writer.sent == 2 and got.done.wait(10)
    reader.stop()


def test_nobody_listening_drops_and_counts(run_dir):
    writer = channel.StepWriter(run_dir)
    for i in range(70):
        writer.add(record(i))  # never raises into the engine loop
    writer.flush()
    assert writer.sent == 0 and writer.dropped == 70


def test_one_reader_per_run(run_dir):
    first = channel.StepReader(run_dir, lambda s: None, lambda f: None, lambda w, e: None)
    second = channel.StepReader(run_dir, lambda s: None, lambda f: None, lambda w, e: None)
    assert first.start()
    assert not second.start()  # another API server of the same serve reads the steps
    first.stop()


def test_a_record_with_a_negative_field_is_refused_not_recorded(run_dir):
    got = Collect(2)
    reader = got.reader(run_dir)
    assert reader.start()
    writer = channel.StepWriter(run_dir)
    bad = record(1)._replace(step_us=-5)
    writer.sock.sendto(LAYOUT.pack(*record(0)) + LAYOUT.pack(*bad) + LAYOUT.pack(*record(2)), writer.address)
    assert got.done.wait(10)
    reader.stop()
    assert got.records == [record(0), record(2)] and got.invalid == [tuple(bad)] and got.errors == []


def test_truncated_datagrams_and_failing_consumers_are_contained(run_dir):
    got = Collect(3)
    calls = []

    def on_record(fields):
        calls.append(fields)
        if len(calls) == 1:
            raise ValueError("consumer failed")
        got.on_record(fields)

    reader = got.reader(run_dir, on_record)
    assert reader.start()
    writer = channel.StepWriter(run_dir)
    writer.sock.sendto(LAYOUT.pack(*record(0)) + b"\x01\x02\x03", writer.address)  # a torn tail
    writer.sock.sendto(LAYOUT.pack(*record(1)) + LAYOUT.pack(*record(2)), writer.address)
    writer.sock.sendto(LAYOUT.pack(*record(3)), writer.address)
    deadline = time.monotonic() + 10
    while record(3) not in got.records and time.monotonic() < deadline:  # the last datagram sent
        time.sleep(0.01)
    reader.stop()
    # record 0 arrived (its consumer failed, counted once) and the rest of its datagram, the torn
    # tail, was dropped; the thread went on to the next datagrams, whose records all arrived
    assert calls[0] == record(0)
    assert got.records == [record(1), record(2), record(3)]
    assert [w for w, _ in got.errors] == ["step_channel"]


