"""The online knee on a real CPU server: after a load ramp the live gauges are finite, with fit
quality, a verdict and a capacity.

How close the live K comes to the K of the ramp's own sweep is a measurement of two wall clocks on
shared cores (benchmarks/knee_agreement.py, figures in docs/knee.md); the two estimators' agreement on
steps whose timing is controlled is tests/unit/test_bench_fake.py's
test_live_and_sweep_knee_agree_on_the_same_steps."""
from __future__ import annotations

import math
import time

import pytest

from support.scrape import scrape, value
from vllm_spark_plugin import cli
from vllm_spark_plugin.settings import Settings

pytestmark = pytest.mark.server
P = "vllm_spark_"


@pytest.fixture(scope="module")
def sweep(vllm_server, tmp_path_factory):
    """The load ramp 1..32 streams: a sweep with the seed protocol (warm-up wave + 2 trials per
    level), the same ramp benchmarks/knee_agreement.py fits both ways."""
    out = tmp_path_factory.mktemp("knee-sweep")
    rc = cli.main(["bench", "--endpoint", vllm_server.base_url, "--model", vllm_server.model, "--api", "completions",
                   "--levels", "1,2,4,8,16,32", "--trials", "2", "--workload", "random", "--random-input-len", "16",
                   "--output-tokens", "256", "--out", str(out), "--quiet"])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def ramp(sweep, vllm_server):
    time.sleep(Settings().knee_refit_seconds + 1.0)  # one refit interval after the ramp
    return scrape(vllm_server.metrics_url)


def test_live_knee_gauges_are_finite_with_fit_quality(ramp):
    for name in ("knee_batch_size", "max_throughput_tokens_per_second", "step_alpha_seconds", "step_beta_seconds"):
        v = value(ramp, P + name)
        assert math.isfinite(v) and v > 0, name
    assert 0 < value(ramp, P + "knee_fit_r2") <= 1
    assert value(ramp, P + "knee_fit_samples") >= 100
    verdicts = {dict(lab)["verdict"]: v for (n, lab), v in ramp.items() if n == P + "knee_verdict"}
    assert sum(verdicts.values()) == 1
    assert verdicts.get("ok") == 1 or verdicts.get("no knee in the measured range") == 1, verdicts
    cap = [v for (n, lab), v in ramp.items() if n == P + "capacity_streams" and dict(lab)["floor"] == "20"]
    assert cap and cap[0] >= 1
    assert all(math.isfinite(v) for (n, _), v in ramp.items() if n.startswith(P))
