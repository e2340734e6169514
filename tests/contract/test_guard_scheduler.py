"""The SLO guard against vLLM's real v1 Scheduler (the installed release), driven step by step with a
seeded load and no model: the model runner's output is made up (one token per request that finished
its prompt), so every decision here is the scheduler's.

* guard off: the registry installs no guard, and with the step hook the scheduled requests and tokens
  of every step are exactly those of an unpatched Scheduler;
* admission: the running requests never exceed the cap once it is in force, no request is preempted
  by the guard or lost, the waiting queue keeps vLLM's order, and the limit is restored after each
  schedule() call;
* prefill: while decode streams run, a step's prefill stays within the budget and a long prompt still
  completes, in more chunks;
* an exception inside the guard is counted under where="guard" and the step is vLLM's own.
"""
from __future__ import annotations

import os
import random
import time

import pytest

import torch  # vLLM's own dependency: always beside it

from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched import scheduler as sched_mod  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from vllm_spark_plugin.common import errors  # noqa: E402
from vllm_spark_plugin.guard import Guard  # noqa: E402
from vllm_spark_plugin.hooks import PATCHES, PLUGIN_LOAD, registration  # noqa: E402
from vllm_spark_plugin.hooks import guard as guard_hook  # noqa: E402
from vllm_spark_plugin.hooks import scheduler as step_hook  # noqa: E402
from vllm_spark_plugin.knee.result import VERDICT_OK, KneeResult  # noqa: E402
from vllm_spark_plugin.settings import Settings  # noqa: E402
from vllm_spark_plugin.vllm import capabilities  # noqa: E402

MAX_SEQS, MAX_TOKENS, BLOCK = 32, 512, 16


@pytest.fixture(scope="module")
def vllm_config(tiny_model_path):
    mc = ModelConfig(model=str(tiny_model_path), max_model_len=4096, dtype="float32")
    sc = SchedulerConfig(max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_TOKENS, max_model_len=4096,
                         enable_chunked_prefill=True, is_encoder_decoder=False)
    vc = VllmConfig(model_config=mc, scheduler_config=sc,
                    cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False))
    vc.cache_config.num_gpu_blocks = 4000
    return vc


def build(cls, vc):
    kv = KVCacheConfig(num_blocks=4000, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8,
                                                      dtype=torch.float32))])
    return cls(vc, kv, StructuredOutputManager(vc), block_size=BLOCK, log_stats=False)


def subclass(name):
    """A fresh subclass of vLLM's Scheduler: the hooks patch it, vLLM's own class stays untouched."""
    return type(name, (sched_mod.Scheduler,), {})


def fixed_fit(capacity, alpha=0.01, beta=0.001, gamma=1e-4):
    return KneeResult(VERDICT_OK, source="steps", alpha_seconds=alpha, beta_seconds=beta,
                      gamma_seconds_per_prefill_token=gamma, capacity={"20": capacity})


class FixedKnee:
    """The estimator's interface with a known fit; counts the steps it is fed."""

    def __init__(self, fit) -> None:
        self.fit, self.observed, self.first_tokens = fit, 0, []

    def observe(self, *a) -> None:
        self.observed += 1

    def observe_ttft(self, batch, seconds) -> None:
        self.first_tokens.append((batch, seconds))

    def estimate(self, force=False):
        return self.fit

    def recent_steps(self, n):
        return (), (), ()

    def ttft_capacity(self):
        from vllm_spark_plugin.knee.slo_capacity import ttft_capacity
        return ttft_capacity((), (), None)


class FixedCap:
    """An admission policy (guard/policies.py's interface) that holds one cap: these tests check how
    the hook applies a cap to vLLM's scheduler; the loop that moves it is tested on the plant
    (tests/unit/test_guard_matrix.py).  Counts the finished requests it is told of."""

    name, state, moves = "fixed", "track", 0

    def __init__(self, cap) -> None:
        self.cap, self.finished = cap, []

    def observe_step(self, *a) -> None:
        pass

    def observe_finished(self, seconds_per_token, mean_batch) -> None:
        self.finished.append((seconds_per_token, mean_batch))

    def observe_feedback(self, ratio) -> None:
        pass

    def refit(self, now, ttft_streams=None):
        return None

    def limit(self, running, waiting):
        self.seen = (running, waiting)
        return None if self.cap is None else max(self.cap, running)


def with_guard(s, mode, fit, attr="auto", refit=0.0):
    """The guard on `s`: the cap is the fit's capacity at 20 tok/s (None when the fit has no verdict),
    held by `FixedCap`; the prefill budget reads the fit."""
    attr = capabilities.admission_attribute() if attr == "auto" else attr
    own = getattr(s, attr) if attr else s.max_num_running_reqs
    cap = fit.capacity_at(20.0) if fit.ok else None
    g = Guard(mode, 20.0, own, s.max_num_scheduled_tokens, FixedKnee(fit), refit_seconds=refit,
              policy=FixedCap(cap))
    eg = guard_hook.EngineGuard(g, attr if mode in ("admission", "both") else None, mode in ("prefill", "both"))
    s.__dict__[step_hook.GUARD_STATE] = eg
    return eg


def drive(s, seed=0, steps=400, rate=(0, 1, 2, 3), prompts=(8, 200), outputs=(4, 40), extra=(), check=None):
    """A seeded load: each step adds requests, schedules, and feeds back one token per request whose
    prompt is done.  Returns the per-step (scheduled tokens by request, new request ids)."""
    rng = random.Random(seed)
    trace, n = [], 0
    for rid, prompt, out in extra:
        s.add_request(Request(rid, list(range(1, prompt + 1)), SamplingParams(max_tokens=out, ignore_eos=True),
                              None, arrival_time=time.time()))
    for step in range(steps):
        for _ in range(rng.choice(rate)):
            prompt = rng.randint(*prompts)
            s.add_request(Request(f"r{n}", [rng.randint(1, 500) for _ in range(prompt)],
                                  SamplingParams(max_tokens=rng.randint(*outputs), ignore_eos=True), None,
                                  arrival_time=time.time()))
            n += 1
        out = s.schedule()
        trace.append((dict(out.num_scheduled_tokens), sorted(r.req_id for r in out.scheduled_new_reqs)))
        if check is not None:
            check(s, out)
        ids = list(out.num_scheduled_tokens)
        sampled = [[7] if s.requests[r].num_computed_tokens >= s.requests[r].num_prompt_tokens else [] for r in ids]
        s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                    sampled_token_ids=sampled, logprobs=None,
                                                    prompt_logprobs_dict={}, pooler_output=[]))
    return trace, n


def drain(s, limit=5000, check=None, admitted=None):
    """Steps with no new load until nothing is left; False if something never finished."""
    for _ in range(limit):
        if not s.get_num_unfinished_requests():
            return True
        out = s.schedule()
        if check is not None:
            check(s, out)
        if admitted is not None:
            admitted.extend(sorted(r.req_id for r in out.scheduled_new_reqs))
        ids = list(out.num_scheduled_tokens)
        sampled = [[7] if s.requests[r].num_computed_tokens >= s.requests[r].num_prompt_tokens else [] for r in ids]
        s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                    sampled_token_ids=sampled, logprobs=None,
                                                    prompt_logprobs_dict={}, pooler_output=[]))
    return False


def hooked(name, guard_settings=None):
    cls = subclass(name)
    step_hook.patch_scheduler(cls, errors.report)
    if guard_settings is not None:
        guard_hook.patch_scheduler(cls, guard_settings, errors.report)
    return cls


def test_guard_off_installs_nothing_and_the_scheduler_decides_as_vllms_own(vllm_config):
    guard = next(p for p in PATCHES if p.name == "guard")
    assert not registration.applies(guard, PLUGIN_LOAD, Settings(), "engine_core")
    assert registration.applies(guard, PLUGIN_LOAD, Settings(guard="admission"), "engine_core")
    own, _ = drive(build(subclass("Own"), vllm_config), seed=11)
    plugin, _ = drive(build(hooked("HookOnly"), vllm_config), seed=11)
    assert plugin == own
    assert any(len(tokens) > 4 for tokens, _ in own)  # the load did batch


def test_admission_caps_running_never_preempts_never_loses_and_restores(vllm_config):
    cap = 6
    s = build(hooked("Admission", Settings(guard="admission")), vllm_config)
    with_guard(s, "admission", fixed_fit(cap))
    attr = capabilities.admission_attribute()
    own_limit = getattr(s, attr)
    preempted, held = [], []

    def check(sched, out):
        held.append(sched.__dict__[step_hook.GUARD_STATE].guard.last.held)
        assert len(sched.running) <= cap
        assert getattr(sched, attr) == own_limit  # restored after schedule()
        preempted.extend(getattr(out, "preempted_req_ids", None) or ())

    order = []
    trace, n = drive(s, seed=5, steps=300, rate=(1, 2, 3), outputs=(10, 30), check=check)
    for _, new in trace:
        order.extend(new)
    assert drain(s, check=check, admitted=order)
    assert preempted == []
    assert max(held) > 0  # above the cap, requests were held
    assert s.get_num_unfinished_requests() == 0
    # FCFS kept: requests were admitted in arrival order
    admitted = [int(r[1:]) for r in order]
    assert admitted == sorted(admitted) and len(set(admitted)) == len(admitted)
    # every request arrived was admitted once (none lost)
    assert len(admitted) == n


class Records:
    """The step hook's writer: keeps the records it is given."""

    def __init__(self) -> None:
        self.steps = []
        self.address = "test"

    def add(self, step) -> None:
        self.steps.append(step)

    def flush(self) -> None:
        pass


def test_admission_values_and_waits_reach_the_step_record(vllm_config):
    from vllm_spark_plugin.metrics.step import LAYOUT, HookStep
    s = build(hooked("AdmissionWaits", Settings(guard="admission")), vllm_config)
    eg = with_guard(s, "admission", fixed_fit(4))
    records = Records()
    s.__dict__["_vllm_spark_state"] = step_hook._HookState(records, 0)
    drive(s, seed=2, steps=120, rate=(2,))
    assert eg.guard.knee.observed > 100  # the step hook feeds the guard's fit
    steps = records.steps
    assert len(steps) == 120 and all(r.guard_limit == 4 for r in steps)
    assert max(r.guard_held for r in steps) > 0 and all(r.guard_budget == -1 for r in steps)
    waits = [r.guard_wait_us for r in steps if r.guard_wait_us >= 0]
    assert waits and max(waits) > 0
    assert HookStep.from_wire(LAYOUT.unpack(steps[-1].pack())) == steps[-1]  # the wire carries them


def test_prefill_budget_bounds_the_prefill_per_step_and_a_long_prompt_completes(vllm_config):
    # room at the floor with 8 decode streams: (1/20 - 0.01 - 0.001*8) / 1e-3 = 32 tokens -> 64 (minimum)
    fit = fixed_fit(30, gamma=1e-3)
    s = build(hooked("Prefill", Settings(guard="prefill")), vllm_config)
    eg = with_guard(s, "prefill", fit)
    steps_with_long = []

    def check(sched, out):
        d = eg.guard.last
        decode = [r for r, t in out.num_scheduled_tokens.items()
                  if sched.requests[r].num_computed_tokens - t >= sched.requests[r].num_prompt_tokens]
        if d.prefill_budget is not None:
            assert out.total_num_scheduled_tokens <= d.token_budget
            prefill = out.total_num_scheduled_tokens - len(decode)
            assert prefill <= d.prefill_budget + len(decode)  # within the bound
        if "long" in out.num_scheduled_tokens:
            steps_with_long.append(out.num_scheduled_tokens["long"])
        assert sched.max_num_scheduled_tokens == MAX_TOKENS  # restored

    drive(s, seed=3, steps=200, rate=(0, 1), prompts=(4, 16), outputs=(200, 300),
          extra=[(f"d{i}", 4, 400) for i in range(8)] + [("long", 2000, 5)], check=check)
    assert drain(s, check=check)
    long_chunks = [t for t in steps_with_long if t > 1]
    assert sum(long_chunks) >= 2000 and len(long_chunks) > 2000 // MAX_TOKENS + 1  # more, smaller chunks


def test_an_exception_in_the_guard_is_counted_and_the_step_is_vllms_own(vllm_config, monkeypatch):
    counted = []
    monkeypatch.setattr(errors, "report", lambda where, exc: counted.append(where))
    own, _ = drive(build(subclass("OwnForFault"), vllm_config), seed=9, steps=150)
    s = build(hooked("Faulty", Settings(guard="admission")), vllm_config)
    eg = with_guard(s, "admission", fixed_fit(2))

    def boom(*a, **k):
        raise RuntimeError("guard bug")
    monkeypatch.setattr(eg.guard, "decide", boom)
    faulty, _ = drive(s, seed=9, steps=150)
    assert faulty == own
    assert counted and set(counted) == {"guard"}


def test_no_cap_and_no_budget_leave_vllm_alone(vllm_config):
    own, _ = drive(build(subclass("OwnNoFit"), vllm_config), seed=4, steps=150)
    s = build(hooked("NoFit", Settings(guard="both")), vllm_config)
    with_guard(s, "both", KneeResult("too few points"))
    assert drive(s, seed=4, steps=150)[0] == own


def test_finished_requests_reach_the_policy_with_their_engine_clock_rate(vllm_config):
    """Each request followed from its first token is handed to the policy once it finishes (vLLM's
    finished_req_ids at the next schedule()), with seconds per token and the mean batch of its steps."""
    s = build(hooked("Finished", Settings(guard="admission")), vllm_config)
    eg = with_guard(s, "admission", fixed_fit(6))
    _, n = drive(s, seed=6, steps=150, rate=(1, 2), outputs=(10, 20))
    assert drain(s)
    s.schedule()  # the last finishes are read at the top of the next schedule()
    seen = eg.guard.policy.finished
    assert len(seen) >= n - 2 and not eg.decoding
    assert all(t > 0 and 1 <= b <= 6 for t, b in seen)


def test_the_levers_are_probed_on_this_release():
    assert capabilities.guard_admission().ok and capabilities.guard_prefill().ok
    assert capabilities.admission_attribute() in capabilities.ADMISSION_ATTRIBUTES


def test_the_guard_counts_every_queue_that_waits_for_a_slot(vllm_config):
    """What waits for a running slot is vLLM's own count (`get_request_counts` where the release has it):
    a request parked in 0.31+'s kv_holding_waiting (or 0.34's async_kv_waiting) holds the cap as bound
    as one in `waiting`."""
    s = build(hooked("CountsWaiting", Settings(guard="admission", floors=(20.0,))), vllm_config)
    eg = with_guard(s, "admission", fixed_fit(1))
    for i in range(4):
        s.add_request(Request(f"w{i}", list(range(1, 9)), SamplingParams(max_tokens=4, ignore_eos=True), None,
                              arrival_time=time.time()))
    side = [q for q in ("kv_holding_waiting", "async_kv_waiting", "skipped_waiting") if hasattr(s, q)]
    if side:  # park one where the release keeps requests that wait outside `waiting`
        req = s.waiting.pop_request()
        getattr(s, side[0]).prepend_request(req) if hasattr(getattr(s, side[0]), "prepend_request") \
            else getattr(s, side[0]).append(req)
        assert len(s.waiting) == 3
    assert capabilities.waiting_requests(s) == 4
    if hasattr(s, "get_request_counts"):
        assert capabilities.waiting_requests(s) == s.get_request_counts()[1]
    s.schedule()
    assert eg.guard.policy.seen == (0, 4)  # the policy was told of all four


@pytest.fixture(scope="module")
def priority_config(tiny_model_path):
    mc = ModelConfig(model=str(tiny_model_path), max_model_len=4096, dtype="float32")
    sc = SchedulerConfig(max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_TOKENS, max_model_len=4096,
                         enable_chunked_prefill=True, is_encoder_decoder=False, policy="priority")
    vc = VllmConfig(model_config=mc, scheduler_config=sc,
                    cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False))
    vc.cache_config.num_gpu_blocks = 4000
    return vc


def test_under_the_cap_priority_scheduling_admits_in_vllms_priority_order(priority_config):
    """vLLM's priority policy keeps working under the cap: every request admitted in a step comes
    before every request left waiting, by vLLM's own key (priority, arrival)."""
    cap = 5
    s = build(hooked("Priority", Settings(guard="admission")), priority_config)
    with_guard(s, "admission", fixed_fit(cap))
    rng = random.Random(23)
    t0, n, held, admitted_all = time.time(), 0, [], []
    for step in range(400):
        for _ in range(rng.choice((0, 1, 2))):
            s.add_request(Request(f"p{n}", [rng.randint(1, 500) for _ in range(rng.randint(8, 64))],
                                  SamplingParams(max_tokens=rng.randint(10, 30), ignore_eos=True), None,
                                  arrival_time=t0 + n * 1e-3, priority=rng.choice((0, 1, 2))))
            n += 1
        key = {r.request_id: (r.priority, r.arrival_time) for r in s.waiting}
        out = s.schedule()
        held.append(s.__dict__[step_hook.GUARD_STATE].guard.last.held)
        assert len(s.running) <= cap
        new = {r.req_id for r in out.scheduled_new_reqs if r.req_id in key}
        left = set(key) - new
        if new and left:
            assert max(key[r] for r in new) < min(key[r] for r in left), f"step {step}: admitted out of priority order"
        admitted_all.extend(new)
        ids = list(out.num_scheduled_tokens)
        sampled = [[7] if s.requests[r].num_computed_tokens >= s.requests[r].num_prompt_tokens else [] for r in ids]
        s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                    sampled_token_ids=sampled, logprobs=None,
                                                    prompt_logprobs_dict={}, pooler_output=[]))
    assert max(held) > 0  # the cap bound: priority order was exercised among held requests
    assert drain(s)
    assert s.get_num_unfinished_requests() == 0


def test_first_tokens_feed_the_ttft_capacity_timed_from_admission(vllm_config):
    """Each admitted request's first token reaches the estimator once, at a batch >= 1, timed from
    its admission: the wait the cap imposed before it is not in it (held requests waited longer than
    any recorded first token took)."""
    cap = 4
    s = build(hooked("Ttft", Settings(guard="admission")), vllm_config)
    eg = with_guard(s, "admission", fixed_fit(cap))
    waited = {}

    def check(sched, out):
        now = time.time()
        for r in out.scheduled_new_reqs:
            waited[r.req_id] = now - sched.requests[r.req_id].arrival_time

    t0 = time.time()
    trace, n = drive(s, seed=9, steps=200, rate=(1, 2), prompts=(8, 40), outputs=(10, 20), check=check)
    assert drain(s, check=check)
    firsts = eg.guard.knee.first_tokens
    assert len(firsts) == n == len(waited) and not eg.first  # one first token per request, none pending
    assert all(b >= 1 and 0 <= t <= time.time() - t0 for b, t in firsts)
    assert max(b for b, _ in firsts) <= cap
    assert max(t for _, t in firsts) < max(waited.values())
