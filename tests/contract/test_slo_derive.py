"""The latency-SLO inputs of each finished request, read from real vLLM stats objects: TTFT =
vLLM's end-to-end latency - decode window, the decode rate from the decode window."""
from __future__ import annotations

import pytest
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats

from vllm_spark_plugin.hooks import stats
from vllm_spark_plugin.metrics.derive import finished_values


def _iteration(*finished: FinishedRequestStats) -> IterationStats:
    i = IterationStats()
    i.finished_requests = list(finished)
    return i


def test_finished_requests_carry_ttft_rate_and_tokens():
    fin = [FinishedRequestStats(finish_reason=FinishReason.LENGTH, num_generation_tokens=65, decode_time=2.0,
                                e2e_latency=2.5, queued_time=0.1, prefill_time=0.3, num_prompt_tokens=16),
           FinishedRequestStats(finish_reason=FinishReason.STOP, num_generation_tokens=1, decode_time=0.0,
                                e2e_latency=0.4, num_prompt_tokens=16),
           FinishedRequestStats(finish_reason=FinishReason.ABORT, num_generation_tokens=0, decode_time=0.0,
                                e2e_latency=3.0, num_prompt_tokens=16)]
    d = finished_values(stats.read(None, _iteration(*fin)).finished)
    assert len(d.slo) == 3, "FinishedRequest lacks e2e_seconds (vLLM's e2e_latency): nothing is judged"
    (t1, r1, n1), (t2, r2, n2), (t3, r3, n3) = d.slo
    assert (t1, r1, n1) == (pytest.approx(0.5), pytest.approx(32.0), 65)
    assert (t2, r2, n2) == (pytest.approx(0.4), None, 1)      # one token: TTFT alone
    assert (t3, r3, n3) == (None, None, 0)                    # aborted before its first token
    assert d.invalid == 0
