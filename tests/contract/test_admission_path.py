"""What decides which waiting request enters RUNNING on the installed vLLM, against the SLO guard's
levers (docs/guard.md, docs/vllm-releases.md): read from the release's Scheduler source through the
probes, and driven on the real class.  Run under each release's environment by
scripts/release-matrix.sh (the CUDA build of a release without a CPU build imports here).

* the admission check (`>= self.max_num_active_reqs`, or `max_num_running_reqs` before 0.32) comes
  before the one place a waiting request enters RUNNING, so a cap set on that attribute bounds RUNNING;
* 0.34's cache-aware admission window reorders the head of the waiting queue before the admission
  loop (it admits nothing itself), and its in-flight KV-load limit holds a request back between the
  check and the entry into RUNNING: with the running slots full, an async KV load may start but the
  request enters RUNNING only through the check once its KV has arrived;
* `schedule(throttle_prefills=...)` (vLLM #44558) reaches vLLM's own schedule() through the guard's
  wrap unchanged, and the step it schedules is the one vLLM schedules without the plugin.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import time

import pytest

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.hooks import guard as guard_hook
from vllm_spark_plugin.hooks import scheduler as step_hook
from vllm_spark_plugin.settings import Settings
from vllm_spark_plugin.vllm import capabilities

BLOCK, MAX_SEQS, MAX_TOKENS = 16, 32, 512


def scheduler_class():
    from vllm.v1.core.sched.scheduler import Scheduler
    return Scheduler


def flat(src: str) -> str:
    """Source with every run of white space one space (line breaks move between releases)."""
    return " ".join(src.split())


def method_source(name: str) -> str:
    return inspect.getsource(inspect.unwrap(getattr(scheduler_class(), name)))


def path() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for name, at in capabilities.admission_path():
        found.setdefault(name, []).append(at)
    return found


def scheduler_config_fields() -> set[str]:
    from vllm.config import SchedulerConfig
    return {f.name for f in dataclasses.fields(SchedulerConfig)}


def test_a_waiting_request_enters_running_in_one_place_after_the_admission_check():
    whole = inspect.getsource(scheduler_class())
    assert whole.count(capabilities.ENTERS_RUNNING) == 1, "another way into RUNNING: the guard's cap may not bind"
    found = capabilities.admission_path()
    assert [at for _, at in found] == sorted(at for _, at in found)
    p = path()
    assert len(p["admission_check"]) == 1 and len(p["enters_running"]) == 1
    assert p["admission_check"][0] < p["enters_running"][0]
    assert capabilities.guard_admission().ok


def test_each_admission_feature_of_the_release_is_placed_against_the_check():
    """Each release's own admission features are found where they cannot take the cap's place."""
    p = path()
    fields = scheduler_config_fields()
    # the probe finds a feature exactly when the release's scheduler config offers it
    assert ("cache_aware_admission" in p) == ("cache_aware_admission_window" in fields)
    assert ("inflight_kv_loads" in p) == ("max_num_inflight_kv_loads" in fields)
    check, enter = p["admission_check"][0], p["enters_running"][0]
    for at in p.get("cache_aware_admission", ()):
        assert at < check, "the cache-aware reorder runs inside the admission loop"
    for at in p.get("inflight_kv_loads", ()):
        assert check < at < enter, "the in-flight KV-load limit is not between the check and RUNNING"


def without(feature: str, method: str) -> bool:
    """True (after checking the release has neither the config field nor the method) when the release
    predates the feature: its admission features' tests then have nothing else to check."""
    if feature in scheduler_config_fields():
        return False
    assert not hasattr(scheduler_class(), method), f"{method} without {feature}: a feature these tests do not know"
    return True


def test_the_cache_aware_window_only_reorders_waiting_requests():
    if without("cache_aware_admission_window", "_reorder_waiting_by_cached_prefix"):
        return
    src = flat(method_source("_reorder_waiting_by_cached_prefix"))
    assert "self.running" not in src and not re.search(r"\.status =(?!=)", src)  # no request leaves WAITING
    assert "self.waiting.remove_requests(head)" in src and "self.waiting.prepend_request(" in src
    assert "cache_aware_window" in inspect.getsource(scheduler_class().__init__)


def test_an_async_kv_load_started_past_the_cap_does_not_enter_running():
    """With RUNNING full (`loads_only`), the loop takes only the async-KV queue; a request whose KV
    loads asynchronously is parked (WAITING_FOR_REMOTE_KVS) and skipped before the one append, and
    enters RUNNING on a later step through the same check (from kv_holding_waiting)."""
    if without("max_num_inflight_kv_loads", "_admits_inflight_kv_load"):
        return
    schedule = flat(method_source("schedule"))
    attr = capabilities.admission_attribute()
    gate = schedule.index(f"loads_only = ( num_running >= self.{attr}")
    held = schedule.index("loads_only and not load_kv_async")
    park = schedule.index("request.status = RequestStatus.WAITING_FOR_REMOTE_KVS")
    enter = schedule.index(capabilities.ENTERS_RUNNING)
    assert gate < held < park < enter
    assert schedule.index("self._admits_inflight_kv_load()", gate) < park
    assert "skip_request(request_queue) continue" in schedule[park:enter]  # parked: never reaches the append
    assert "request_queue = self.kv_holding_waiting" in schedule[gate:held]  # back in through the check


# --- on the real class ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def make_config(tiny_model_path):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    def make(prefix_caching=False, **scheduler):
        mc = ModelConfig(model=str(tiny_model_path), max_model_len=4096, dtype="float32")
        sc = SchedulerConfig(max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_TOKENS, max_model_len=4096,
                             enable_chunked_prefill=True, is_encoder_decoder=False, **scheduler)
        # the CUDA builds (0.33, 0.34) cannot infer a device without a GPU: the scheduler needs none
        vc = VllmConfig(model_config=mc, scheduler_config=sc, device_config=DeviceConfig(device="cpu"),
                        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=prefix_caching))
        vc.cache_config.num_gpu_blocks = 400
        return vc
    return make


def build(cls, vc):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager
    kv = KVCacheConfig(num_blocks=400, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8,
                                                      dtype=torch.float32))])
    return cls(vc, kv, StructuredOutputManager(vc), block_size=BLOCK, log_stats=False)


def block_hasher(vc):
    """The prefix-cache block hasher the engine core gives each request (EngineCore.__init__)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
    init_none_hash(fn)
    return get_request_block_hasher(BLOCK, fn)


def add(s, rid, prompt, max_tokens, hasher=None):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request
    s.add_request(Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True), None,
                          arrival_time=time.time(), block_hasher=hasher))


def feed(s, out):
    """One token for each scheduled request whose prompt is done (no model: the scheduler decides)."""
    from vllm.v1.outputs import ModelRunnerOutput
    ids = list(out.num_scheduled_tokens)
    sampled = [[7] if s.requests[r].num_computed_tokens >= s.requests[r].num_prompt_tokens else [] for r in ids]
    kw = dict(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
              logprobs=None, prompt_logprobs_dict={}, pooler_output=[])
    names = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    s.update_from_output(out, ModelRunnerOutput(**{k: v for k, v in kw.items() if k in names}))


def step(s, **kw):
    out = s.schedule(**kw)
    feed(s, out)
    return dict(out.num_scheduled_tokens), sorted(r.req_id for r in out.scheduled_new_reqs)


class Capped:
    """Lowers the admission attribute for each schedule() call and restores it after, as the guard's
    lever does (hooks/guard.py; its own wrap is driven in test_guard_scheduler.py): what is tested
    here is how the release's admission features meet a cap set on that attribute."""

    cap = None

    def schedule(self, *args, **kwargs):
        attr = capabilities.admission_attribute()
        own = getattr(self, attr)
        setattr(self, attr, min(own, self.cap))
        try:
            return super().schedule(*args, **kwargs)
        finally:
            setattr(self, attr, own)


def test_under_a_cap_the_cache_aware_window_reorders_but_never_admits_past_it(make_config):
    """Requests sharing a cached prefix overtake cold ones inside the window (vLLM's choice), and
    RUNNING never exceeds the cap; every request is admitted once and none is preempted."""
    if without("cache_aware_admission_window", "_reorder_waiting_by_cached_prefix"):
        return
    cap = 3
    vc = make_config(prefix_caching=True, cache_aware_admission_window=8, cache_aware_admission_threshold=0.0)
    s = build(type("CacheAwareCapped", (Capped, scheduler_class()), {"cap": cap}), vc)
    assert s.cache_aware_window == 8
    hasher = block_hasher(vc)
    hot = list(range(1, 4 * BLOCK + 1))  # four full blocks, cached once "warm" has run
    add(s, "warm", hot + [500], 2, hasher)
    while s.get_num_unfinished_requests():
        step(s)
    order, n = [], 0
    for i in range(12):  # arrivals alternate cold (no cached prefix) and hot
        add(s, f"q{n:02d}-{'hot' if i % 2 else 'cold'}", (hot if i % 2 else [300 + i] * (4 * BLOCK)) + [400 + i], 6,
            hasher)
        n += 1
    for _ in range(400):
        if not s.get_num_unfinished_requests():
            break
        out = s.schedule()
        assert len(s.running) <= cap
        assert not getattr(out, "preempted_req_ids", None)
        order.extend(sorted(r.req_id for r in out.scheduled_new_reqs))
        feed(s, out)
    assert s.get_num_unfinished_requests() == 0
    assert sorted(order) == sorted(set(order)) and len(order) == n  # each admitted once, none lost
    assert order != sorted(order), "the window reordered nothing: the feature was not exercised"
    assert all(r.endswith("hot") for r in order[:cap]), order  # the hot ones went first


def test_throttle_prefills_passes_through_the_guards_wrap_by_signature():
    own = inspect.signature(scheduler_class().schedule)
    assert "throttle_prefills" in own.parameters  # every release 0.26-0.34
    cls = type("GuardSignature", (scheduler_class(),), {})
    step_hook.patch_scheduler(cls, errors.report)
    guard_hook.patch_scheduler(cls, Settings(guard="admission"), errors.report)
    wrapper = inspect.signature(cls.schedule, follow_wrapped=False)
    kinds = {p.kind for p in wrapper.parameters.values()}
    assert {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds, wrapper
    assert inspect.signature(cls.schedule) == own  # probes read vLLM's own signature through the wrap


def test_throttle_prefills_reaches_vllms_schedule_through_the_guard_unchanged(make_config):
    """The real class, patched by the step hook and the guard as in the engine core: vLLM's
    schedule() receives throttle_prefills as given, and defers a new prefill while decodes run
    exactly as it does without the plugin (and admits it when not throttled).  The steps are compared
    with vLLM's own under SPARK_PLUGIN_GUARD=prefill, which sets no limit before its fit has a verdict;
    under admission (and both) the guard's slow start caps from the first step, so there the flag's
    passage is what is compared."""
    seen = []

    class Spy(scheduler_class()):
        def schedule(self, *args, **kwargs):
            seen.append(kwargs)
            return super().schedule(*args, **kwargs)

    reported = []

    def on_error(where, exc):
        reported.append((where, exc))

    def guarded(mode):
        cls = type(f"Guarded_{mode}", (Spy,), {})
        step_hook.patch_scheduler(cls, on_error)
        guard_hook.patch_scheduler(cls, Settings(guard=mode), on_error)
        return cls

    def run(cls, throttle):
        seen.clear()
        s = build(cls, make_config())
        for i in range(4):
            add(s, f"d{i}", range(1, 9), 50)
        trace = [step(s)]  # admits the four: they decode from the next step on
        add(s, "late", range(1, 33), 5)
        trace += [step(s, throttle_prefills=throttle) for _ in range(3)]
        return s, trace, list(seen)

    _, own, _ = run(type("Own", (scheduler_class(),), {}), True)
    s, throttled, kwargs = run(guarded("prefill"), True)
    _, unthrottled, _ = run(guarded("prefill"), False)
    assert s.__dict__.get(step_hook.GUARD_STATE)  # the guard ran around each call
    assert kwargs == [{}] + [{"throttle_prefills": True}] * 3
    assert throttled == own  # the steps vLLM schedules without the plugin
    assert "late" not in throttled[1][0] and "late" in unthrottled[1][0]  # the flag acted
    for throttle in (True, False):
        s, _, kwargs = run(guarded("both"), throttle)
        assert s.__dict__.get(step_hook.GUARD_STATE)
        assert kwargs == [{}] + [{"throttle_prefills": throttle}] * 3
    assert reported == []
