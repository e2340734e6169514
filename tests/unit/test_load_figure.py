"""The /get_load figure (metrics.load): it orders servers as a router should pick them, is never
negative, falls back to running + waiting without a verdict, and with several API servers reads the
same most recent gauges /metrics shows."""
from __future__ import annotations

from prometheus_client.mmap_dict import MmapedDict, mmap_key

from vllm_spark_plugin.metrics import load, names as n
from vllm_spark_plugin.metrics.load import LOAD_AT_ZERO_SPARE, EngineFigures as E


def test_less_spare_capacity_is_a_higher_load():
    roomy = load.server_load([E(running=4, waiting=0, capacity=20)])     # 16 spare
    tight = load.server_load([E(running=4, waiting=0, capacity=5)])      # 1 spare
    full = load.server_load([E(running=5, waiting=0, capacity=5)])       # 0 spare
    over = load.server_load([E(running=5, waiting=3, capacity=5)])       # 3 over
    assert roomy < tight < full < over
    assert full == LOAD_AT_ZERO_SPARE and over == LOAD_AT_ZERO_SPARE + 3 and roomy == LOAD_AT_ZERO_SPARE - 16


def test_waiting_requests_count_against_the_spare():
    assert load.server_load([E(2, 3, 10)]) == load.server_load([E(5, 0, 10)])


def test_never_negative():
    assert load.server_load([E(0, 0, LOAD_AT_ZERO_SPARE + 500)]) == 0
    assert load.server_load([]) == 0


def test_without_a_verdict_the_running_plus_waiting_requests():
    assert load.server_load([E(running=3, waiting=2, capacity=None)]) == 5
    # one engine of a data-parallel server without a verdict: the server has none
    assert load.server_load([E(1, 0, 40), E(2, 1, None)]) == 4


def test_data_parallel_engines_add_their_spare():
    assert load.server_load([E(1, 0, 10), E(3, 0, 10)]) == LOAD_AT_ZERO_SPARE - 16


class _State:  # the fields of metrics.engine.EngineState the reader uses
    def __init__(self, running, waiting, caps):
        self.running_now, self.waiting_now, self.slo_capacity = running, waiting, caps


def test_the_capacity_is_the_smallest_over_the_floors_and_unknown_counts_are_zero():
    figures = load.from_engines([_State(3, None, (12, 0)), _State(None, 1, (None, None)), _State(2, 0, (9, None))])
    assert figures == [E(3, 0, 0), E(0, 1, None), E(2, 0, 9)]


def _write(path, rows, ts):
    """Gauge files as prometheus-client's multiprocess mode writes them (its own writer)."""
    d = MmapedDict(str(path))
    for name, labels, value in rows:
        d.write_value(mmap_key(name, name, list(labels), list(labels.values()), ""), value, ts)
    d.close()


def test_several_api_servers_answer_with_the_most_recent_gauges(tmp_path):
    lab = {"model_name": "m", "engine": "0"}
    # API server 111 wrote first; 222 later (its running count and the refit's capacity are newer)
    _write(tmp_path / "gauge_mostrecent_111.db",
           [(n.RUNNING, lab, 9), (n.WAITING, lab, 4), (n.SLO_CAPACITY, {**lab, "floor": "20"}, 30)], ts=100.0)
    _write(tmp_path / "gauge_mostrecent_222.db",
           [(n.RUNNING, lab, 2), (n.SLO_CAPACITY, {**lab, "floor": "20"}, 12),
            (n.SLO_CAPACITY, {**lab, "floor": "2000"}, 0),
            (n.RUNNING, {"model_name": "other", "engine": "0"}, 50)], ts=200.0)
    figures = load.from_multiprocess(str(tmp_path), "m")
    assert figures == [E(running=2, waiting=4, capacity=0)]  # the 2,000 tok/s floor's capacity is the smallest
    assert load.server_load(figures) == LOAD_AT_ZERO_SPARE + 6
