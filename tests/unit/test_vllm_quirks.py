"""`vllm/quirks.py`: each difference between vLLM releases that the inbound side reads, answered for
a release that has the piece and for one that lacks it; and each names the releases it applies to.
(Plain objects stand in for vLLM's: only the attribute each quirk reads matters.)"""
from __future__ import annotations

import inspect
import re
from types import SimpleNamespace

from vllm_spark_plugin.vllm import quirks


def test_every_quirk_names_the_releases_it_applies_to():
    fns = [f for name, f in inspect.getmembers(quirks, inspect.isfunction) if f.__module__ == quirks.__name__]
    assert len(fns) >= 3
    for f in fns:
        assert re.search(r"\b0\.\d+ (to|on)\b", f.__doc__ or ""), f"{f.__name__}: which releases?"


def test_cached_output_tokens():
    assert quirks.cached_output_tokens(SimpleNamespace(req_ids=["a"], num_output_tokens=[0])) == [0]
    assert quirks.cached_output_tokens(SimpleNamespace(req_ids=["a"])) is None


def test_unfinished_requests_by_vllms_count_else_by_the_two_queues():
    assert quirks.has_unfinished_requests(SimpleNamespace(get_num_unfinished_requests=lambda: 2, running=[]))
    assert not quirks.has_unfinished_requests(SimpleNamespace(get_num_unfinished_requests=lambda: 0, running=[1]))
    assert quirks.has_unfinished_requests(SimpleNamespace(running=[], waiting=[1]))
    assert not quirks.has_unfinished_requests(SimpleNamespace(running=[], waiting=[]))


def test_moe_backend_choice():
    assert quirks.moe_backend_choice(SimpleNamespace(moe_backend="auto"))
    assert not quirks.moe_backend_choice(SimpleNamespace())
