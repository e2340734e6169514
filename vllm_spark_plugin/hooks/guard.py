"""The SLO guard in the engine core (docs/guard.md): wraps vLLM's v1 `Scheduler.schedule` so that,
for the one call, the limit on admission into RUNNING is the guard's cap and the step's token budget
bounds the prefill; both attributes are restored as soon as vLLM's schedule() returns.  vLLM keeps
its own queue and its own order; a running request is never preempted by the guard (the limit is
never below what already runs) and none is dropped.

The decisions are `guard.Guard`'s; the fit it acts on is fed by the step hook (`hooks.scheduler`
calls `step_fields` with each step's values, and puts what it returns on the step record).  The
levers are probed per release (`vllm.capabilities.guard_admission`, `guard_prefill`); a lever the
installed vLLM lacks is said once in the log and left alone.  Any exception in the guard is counted
under where="guard" and that step is vLLM's own decision.

Registered in `hooks.PATCHES` as "guard"; installed only with SPARK_PLUGIN_GUARD set (not off).
"""
from __future__ import annotations

import itertools
import logging
import time

from vllm_spark_plugin.hooks import after_import, patching
from vllm_spark_plugin.hooks.scheduler import GUARD_STATE
from vllm_spark_plugin.metrics.step import NOT_COUNTED
from vllm_spark_plugin.vllm.capabilities import BUDGET_ATTRIBUTE, SCHEDULER_MODULE, waiting_requests

log = logging.getLogger("vllm_spark_plugin")

PATCH = "guard"


MAX_FIRST_PENDING = 4096  # admitted requests awaiting their first token that are followed for TTFT
MAX_DECODING = 4096       # requests past their first token followed to their finish (engine-clock rate)


class EngineGuard:
    """One scheduler's guard: the domain `Guard`, the release's admission attribute (None: not
    guarded), whether the token budget is guarded, the admitted requests whose first token is
    awaited ({request id: when admitted}, for the TTFT capacity), the requests followed from their
    first token to their finish ({request id: (request, first token time, guard mark)}: each finished
    request's decode rate on the engine clock) and the API server's feedback file."""

    __slots__ = ("guard", "admission_attr", "budget", "first", "decoding", "feedback")

    def __init__(self, guard, admission_attr: str | None, budget: bool, feedback=None) -> None:
        self.guard = guard
        self.admission_attr = admission_attr
        self.budget = budget
        self.first: dict = {}
        self.decoding: dict = {}
        self.feedback = feedback  # metrics.delivery.FeedbackReader or None

    def first_tokens(self, sched) -> None:
        """Time to first token from admission of the requests whose first token the last step produced
        (seen at the top of the next schedule(): the previous step's outputs are in)."""
        now = time.monotonic()
        batch = len(sched.running)
        requests = sched.requests
        g = self.guard
        for rid in [r for r in self.first if (requests.get(r) is None or requests[r].num_output_tokens > 0)]:
            admitted = self.first.pop(rid)
            req = requests.get(rid)
            if req is not None and batch:
                g.observe_ttft(batch, max(0.0, now - admitted))
                if len(self.decoding) < MAX_DECODING:
                    self.decoding[rid] = (req, now, g.mark())

    def finished(self, sched) -> None:
        """The requests that finished in the last step (vLLM's `finished_req_ids`, cleared by its
        schedule()): tokens over first-to-last-token seconds on the engine clock."""
        now = time.monotonic()
        for rid in sched.finished_req_ids:
            followed = self.decoding.pop(rid, None)
            if followed is not None:
                req, first, mark = followed
                self.guard.observe_finished(req.num_output_tokens, now - first, mark)

    def decide(self, sched) -> list:
        """Set this step's limits on `sched`; returns [(attribute, vLLM's value)] to restore."""
        g = self.guard
        if self.decoding and getattr(sched, "finished_req_ids", None):
            self.finished(sched)
        if self.first:
            self.first_tokens(sched)
        if self.feedback is not None:
            ratio = self.feedback.poll()
            if ratio is not None:
                g.observe_feedback(ratio)
        running = len(sched.running)
        waiting = waiting_requests(sched)  # every queue that waits for a slot, not only `waiting`
        spec = getattr(sched, "num_spec_tokens", 0) or 0
        d = g.decide(running, waiting, running * (1 + spec))
        saved = []
        if d.limit is not None and self.admission_attr is not None:
            saved.append((self.admission_attr, getattr(sched, self.admission_attr)))
        if d.token_budget is not None and self.budget:
            saved.append((BUDGET_ATTRIBUTE, getattr(sched, BUDGET_ATTRIBUTE)))
        for attr, own in saved:  # never above vLLM's own value
            setattr(sched, attr, min(own, d.limit if attr == self.admission_attr else d.token_budget))
        if d.held:
            g.deferred.hold(r.request_id for r in itertools.islice(sched.waiting, d.held))
        return saved

    def admitted(self, sched, out) -> None:
        new = out.scheduled_new_reqs
        if not new:
            return
        if self.guard.deferred.since:
            self.guard.deferred.admitted(r.req_id for r in new)
        if not self.guard.admission or len(self.first) >= MAX_FIRST_PENDING:
            return
        now = time.monotonic()
        for r in new:
            self.first[r.req_id] = now

    def step_fields(self, batch: int, prefill_tokens: int, step_us: int, sampled: int) -> tuple:
        """Feed the fit one step; the guard's fields of the step record (`HookStep`)."""
        g = self.guard
        if batch:
            tps = max(1.0, sampled / batch) if sampled >= 0 else 1.0
            g.observe(batch, prefill_tokens, step_us * 1e-6, tps)
        d = g.last
        wait = g.deferred.next_wait()
        return (NOT_COUNTED if d.limit is None else d.limit,
                d.held if g.admission else NOT_COUNTED,
                NOT_COUNTED if d.prefill_budget is None else d.prefill_budget,
                NOT_COUNTED if wait is None else int(wait * 1e6))


def levers(mode: str) -> tuple[str | None, bool, list[str]]:
    """(admission attribute or None, prefill budget guarded, what is off and why) for `mode` on the
    installed vLLM."""
    from vllm_spark_plugin.vllm import capabilities
    off = []
    attr, budget = None, False
    if mode in ("admission", "both"):
        cap = capabilities.guard_admission()
        if cap.ok:
            attr = capabilities.admission_attribute()
        else:
            off.append(f"admission ({cap.reason})")
    if mode in ("prefill", "both"):
        cap = capabilities.guard_prefill()
        budget = cap.ok
        if not cap.ok:
            off.append(f"prefill ({cap.reason})")
    return attr, budget, off


def install(patch, settings, on_error, **_context) -> None:
    """Wrap the v1 Scheduler for the guard now, or once its module is imported (engine core only)."""
    if not settings.scheduler_hook:
        log.warning("vllm-spark-plugin: SPARK_PLUGIN_GUARD=%s needs the step hook: set "
                    "SPARK_PLUGIN_SCHEDULER_HOOK=1; the guard is off", settings.guard)
        return
    after_import.patch_when_imported(SCHEDULER_MODULE, patch.probe,
                                     lambda module: patch_scheduler(module.Scheduler, settings, on_error),
                                     on_error, "guard_install", "SLO guard off in this engine core")


def new_guard(sched, settings, attr: str | None, budget: bool) -> EngineGuard:
    from vllm_spark_plugin.guard import Guard, prior
    from vllm_spark_plugin.hooks import channel
    from vllm_spark_plugin.knee.online import OnlineKneeEstimator
    from vllm_spark_plugin.metrics.delivery import FeedbackReader
    mode = {(True, True): "both", (True, False): "admission", (False, True): "prefill"}[(attr is not None, budget)]
    own_limit = getattr(sched, attr) if attr else sched.max_num_running_reqs
    line, start = prior.from_profile(settings.profile)
    g = Guard(mode, settings.first_floor, int(own_limit), int(getattr(sched, BUDGET_ATTRIBUTE)),
              OnlineKneeEstimator.from_settings(settings), settings.knee_refit_seconds, prior=line)
    directory = channel.run_dir()
    log.info("vllm-spark-plugin: SLO guard active in this engine core (%s at %g tok/s; limit %s=%d, "
             "token budget %d; admission starts from %s)", mode, g.floor, attr or "-", g.max_num_seqs,
             g.max_tokens, start)
    return EngineGuard(g, attr, budget,
                       FeedbackReader(directory, settings.knee_refit_seconds) if directory and g.admission else None)


def patch_scheduler(Scheduler, settings, on_error) -> None:
    if patching.marked(Scheduler, PATCH):
        return
    attr, budget, off = levers(settings.guard)
    for what in off:
        log.warning("vllm-spark-plugin: SPARK_PLUGIN_GUARD=%s: the %s lever is off on this vLLM: %s; vLLM "
                    "decides that alone", settings.guard, *what.split(" ", 1))
    if attr is None and not budget:
        return
    orig_schedule = Scheduler.schedule

    def schedule(self, *args, **kwargs):
        saved = ()
        eg = None
        try:
            eg = self.__dict__.get(GUARD_STATE)
            if eg is None:
                eg = False  # a guard that cannot be built stays off for this scheduler
                self.__dict__[GUARD_STATE] = False
                eg = self.__dict__[GUARD_STATE] = new_guard(self, settings, attr, budget)
            if eg:
                saved = eg.decide(self)
        except Exception as exc:
            _restore(self, saved)
            saved = ()
            on_error("guard", exc)
        try:
            out = orig_schedule(self, *args, **kwargs)
        finally:
            if saved:
                _restore(self, saved)
        if eg:
            try:
                eg.admitted(self, out)
            except Exception as exc:
                on_error("guard", exc)
        return out

    patching.replace(PATCH, Scheduler, "schedule", schedule)
    patching.mark(Scheduler, PATCH)


def _restore(sched, saved) -> None:
    for attr, own in saved:
        setattr(sched, attr, own)
