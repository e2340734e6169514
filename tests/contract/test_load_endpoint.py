"""GET /get_load goes in through vLLM's own app wiring (`attach_endpoint_plugins`, the call its
`build_app` makes) with VLLM_PLUGINS unset, answers the figure of the exporter's engines, and a
failure is counted and answered with 503 (no server here: the live check is tests/integration/test_router.py)."""
from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from vllm_spark_plugin.hooks import PATCHES, load_endpoint
from vllm_spark_plugin.metrics.load import LOAD_AT_ZERO_SPARE
from vllm_spark_plugin.settings import Settings
from vllm_spark_plugin.vllm import capabilities

PATCH = next(p for p in PATCHES if p.name == "load_endpoint")


@pytest.fixture
def installed(fresh, monkeypatch):
    """The patch installed for this test only (vLLM's loader restored after), on a test registry."""
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    owner = capabilities.endpoint_plugin_loader_owner()
    monkeypatch.setattr(owner, "load_endpoint_plugins", owner.load_endpoint_plugins)  # restored after the test
    monkeypatch.setattr(load_endpoint, "_ORIGINAL", None)
    monkeypatch.setattr(load_endpoint, "_exporter", None)
    exp = fresh.exporter("m", Settings(floors=(20.0, 2000.0)))
    assert load_endpoint.install(PATCH, exp.settings, None, exporter=exp) is True
    return exp


def _app() -> TestClient:
    app = FastAPI()
    capabilities.endpoint_plugins_attacher()(app, ("generate",))
    return TestClient(app)


def test_the_route_answers_the_engines_load_through_vllms_wiring(installed):
    st = installed.engine(0)
    client = _app()
    assert client.get("/get_load").json() == {"load": 0}  # nothing known yet
    st.running_now, st.waiting_now = 3, 2
    assert client.get("/get_load").json() == {"load": 5}  # no verdict: running + waiting
    st.slo_capacity = (12, None)  # capacity under both SLOs at 20 tok/s; none yet at 2,000
    assert client.get("/get_load").json() == {"load": LOAD_AT_ZERO_SPARE - 7}
    st.slo_capacity = (12, 0)  # the highest floor's is the smallest: no spare
    assert client.get("/get_load").json() == {"load": LOAD_AT_ZERO_SPARE + 5}


def test_installing_twice_adds_one_route(installed):
    load_endpoint.install(PATCH, installed.settings, None, exporter=installed)
    app = _app().app
    assert [r.path for r in app.routes].count("/get_load") == 1


def test_a_failure_is_counted_and_answered_with_503(installed, monkeypatch):
    def broken():
        raise RuntimeError("boom")
    monkeypatch.setattr(load_endpoint, "current_load", broken)
    r = _app().get("/get_load")
    assert r.status_code == 503 and "load unavailable" in r.json()["error"]
    assert installed.ins.errors.labels(where="load_endpoint")._value.get() == 1
