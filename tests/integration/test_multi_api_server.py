"""Several API servers (prometheus-client multiprocess mode): per-step stats reach exactly one of
them, so histograms and counters add up across processes to the truth."""
from __future__ import annotations

import time

import pytest

from support.load import run_streams
from support.scrape import scrape, value

pytestmark = pytest.mark.server
P = "vllm_spark_"


def test_counts_add_up_across_api_servers(multi_api_server):
    s0 = scrape(multi_api_server.metrics_url)
    streams = run_streams(multi_api_server.base_url, multi_api_server.model, 8, max_tokens=64, prompt_prefix="multi")
    time.sleep(1.0)
    s1 = scrape(multi_api_server.metrics_url)
    d = lambda name, **lab: value(s1, name, **lab) - value(s0, name, **lab)  # noqa: E731
    assert d(P + "ttft_seconds_count") == 8
    assert d(P + "stream_decode_tokens_per_second_count") == 8
    assert d(P + "generation_tokens_total") == sum(s.output_tokens for s in streams)
    assert d(P + "step_batch_size_count") > 0
    assert d(P + "step_duration_seconds_count") == d(P + "step_batch_size_count")
    assert value(s1, P + "kv_blocks_total") > 0
    # hardware is sampled by one process only, so memory is reported once, not twice
    totals = [v for (n, lab), v in s1.items() if n == P + "unified_memory_bytes" and dict(lab)["kind"] == "total"]
    assert len(totals) == 1
