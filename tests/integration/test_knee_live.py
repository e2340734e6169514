"""The online knee on a real CPU server: after a load ramp the live gauges are finite and agree
with the knee fitted offline from a sweep of the same server."""
from __future__ import annotations

import json
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
    """The load ramp 1..32 streams is a sweep with the seed protocol (warm-up wave + 2 trials per
    level), so the live estimator and the offline fit see the same steps; the tiny model's step
    time on a CPU is not exactly linear in the batch, so comparing fits of different batch mixes
    would compare the curvature, not the estimators."""
    return _run_sweep(vllm_server, tmp_path_factory.mktemp("knee-sweep"))


def _run_sweep(server, out):
    rc = cli.main(["bench", "--endpoint", server.base_url, "--model", server.model, "--api", "completions",
                   "--levels", "1,2,4,8,16,32", "--trials", "2", "--workload", "random", "--random-input-len", "16",
                   "--output-tokens", "256", "--out", str(out), "--quiet"])
    assert rc == 0
    return out


def _after_refit(server):
    time.sleep(Settings().knee_refit_seconds + 1.0)  # one refit interval after the ramp
    return scrape(server.metrics_url)


@pytest.fixture(scope="module")
def ramp(sweep, vllm_server):
    return _after_refit(vllm_server)


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


def _agreement(live: float, sweep_dir, capsys) -> tuple[bool, str]:
    capsys.readouterr()
    assert cli.main(["knee", str(sweep_dir / "sweep.csv"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    if "knee" not in res:  # {label: result} when several curves
        res = next(iter(res.values()))
    offline = res["knee"]
    assert offline and math.isfinite(offline)
    lo, hi = (res.get("ci") or {}).get("knee") or (None, None)
    hi = math.inf if hi is None else hi  # unbounded above: the sweep has no upper limit on K
    within_30 = abs(live - offline) / offline <= 0.30
    # Where the sweep itself cannot pin K to 30% (its client-side rates are noisy on 2 shared cores),
    # agreement means the live K lies inside the sweep's own bootstrap 95% interval.
    within_ci = lo is not None and hi is not None and lo <= live <= hi and (hi - lo) / offline > 0.60
    return within_30 or within_ci, f"live K {live:.1f} vs sweep K {offline:.1f} (95% CI {lo} .. {hi})"


def test_live_knee_agrees_with_sweep_knee(ramp, sweep, vllm_server, tmp_path, capsys):
    """A second sweep runs only when the first disagrees (this box's speed drifts during a sweep,
    which bends the client-side curve); the second must agree."""
    ok, first = _agreement(value(ramp, P + "knee_batch_size"), sweep, capsys)
    if ok:
        return
    again = _run_sweep(vllm_server, tmp_path / "again")
    ok, second = _agreement(value(_after_refit(vllm_server), P + "knee_batch_size"), again, capsys)
    assert ok, f"first: {first}; second: {second}"
