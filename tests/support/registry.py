"""A prometheus-client registry of a test's own, for the code under test that takes its exporter
from `metrics.exporter.get` (the stat logger) and counts contained errors with `errors.report`."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.metrics import exporter as exporter_mod


class Fresh:
    """A prometheus-client registry of this test's own: the exporter the code under test gets
    (`exporter.get`) and the contained-error counter (`errors.report`) both write to it."""

    def __init__(self, monkeypatch):
        self.registry = CollectorRegistry()
        self.exp: exporter_mod.Exporter | None = None
        self._monkeypatch = monkeypatch
        monkeypatch.setattr(exporter_mod, "get", self.exporter)

    def exporter(self, model: str, settings=None, hook_steps: bool = False) -> exporter_mod.Exporter:
        """One exporter per test (its instruments take the registry's names once); default settings."""
        if self.exp is None:
            from vllm_spark_plugin.settings import Settings
            self.exp = exporter_mod.Exporter(model, settings or Settings(), registry=self.registry,
                                             hook_steps=hook_steps)
            self._monkeypatch.setattr(errors, "_counter", self.exp.ins.errors)
        assert self.exp.model == model
        return self.exp

    def errors_total(self) -> float:
        return sum(s.value for fam in self.registry.collect() if fam.name == "vllm_spark_plugin_errors"
                   for s in fam.samples if s.name.endswith("_total"))

    def sample(self, name, **labels) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def values(self, family: str, **labels) -> list:
        """(labels, value) of the family's samples whose labels include `labels`."""
        want = set(labels.items())
        return [(s.labels, s.value) for fam in self.registry.collect() if fam.name == family
                for s in fam.samples if want <= set(s.labels.items())]


@pytest.fixture
def fresh(monkeypatch):
    return Fresh(monkeypatch)
