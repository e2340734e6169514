"""The fake OpenAI server (vllm_spark_plugin/testbed/fake_server.py) for tests of the bench command:
the `fake` fixture (a factory: each call starts one fake on the wall clock, all stopped after the
test), the command itself and the rows of the sweep.csv it writes.  Registered in tests/conftest.py."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vllm_spark_plugin.cli import main as vllm_spark
from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer


@pytest.fixture
def fake():
    servers = []

    def start(**kw) -> FakeServer:
        s = FakeServer(FakeConfig(**kw)).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def rows(out: Path, row_type: str | None = None) -> list[dict]:
    with open(out / "sweep.csv", newline="") as fh:
        data = list(csv.DictReader(fh))
    return [r for r in data if row_type is None or r["row_type"] == row_type]


def bench(*argv) -> int:
    return vllm_spark(["bench", "--quiet", *argv])
