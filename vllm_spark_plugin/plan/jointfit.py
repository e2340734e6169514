"""Calibration that separates the machine/engine from the model, fitted over several models at once.

Why: fitted to one model's sweep, free machine factors absorb what belongs to that model (its routing
skew, its kernels' overhead) and carry it to every other model -- seed 001's two points gave a
bandwidth efficiency above 1.  Here each observed decode rate is explained by

    t(b) = s_engine * m_model * O + x * M(b; skew_model) + p_model * (x * S(b) + C(b) / compute) + K

with shared machine/engine factors (x = 1 / bandwidth efficiency, s_engine = overhead scale per
engine) and per-model factors (m_model = overhead multiplier, p_model = per-stream work multiplier
on the cache/state traffic S and the compute C, skew_model = routing skew).  Both kinds
have priors centred on the defaults (the published routing statistic for the skew); the fit is the
maximum a posteriori solution (Levenberg-Marquardt on log-rate residuals plus prior residuals).  A
model seen at one concurrency only cannot move its skew; a factor the data do not constrain stays at
its prior.  Widths of the priors: docs/plan.md, "Calibration".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from vllm_spark_plugin.plan.deployment import Deployment
from vllm_spark_plugin.plan.routing import distinct_experts
from vllm_spark_plugin.plan.stepmodel import Efficiency, ModelFactors, StepModel

SIGMA_RATE = 0.05           # published figures: run-to-run spread and inputs the sources do not state
SIGMA_MACHINE = 0.10        # log-width of the machine/engine priors (defaults are physical estimates)
SIGMA_MODEL_OVERHEAD = 0.30 # log-width of a model's overhead multiplier
SIGMA_MODEL_PER_STREAM = 0.30  # log-width of a model's per-stream work multiplier
SIGMA_SKEW = 0.30           # width of the routing-skew prior around the published statistic
MAX_SKEW = 3.0


@dataclass
class Observation:
    dep: Deployment
    concurrency: int
    rate: float          # published decode rate: per stream at c = 1, aggregate above
    model: str
    engine: str


@dataclass
class JointFit:
    machine: dict                      # engine -> Efficiency
    link_scale: float                  # x the profile's interconnect time (latency and bandwidth)
    models: dict                       # model name -> ModelFactors
    rms_log_error: float
    n_observations: int
    fitted: list = field(default_factory=list)

    def efficiency(self, engine: str) -> Efficiency:
        return self.machine.get(engine) or self.machine.get("*") or Efficiency()

    def model_factors(self, model: str) -> ModelFactors | None:
        return self.models.get(model)


class _Terms:
    """Raw step terms of one observation.  Only the routed-expert bytes depend on the routing skew
    (the only non-linear input), so they are recomputed from the expert count alone."""

    def __init__(self, ob: Observation, compute_eff: float):
        sm = StepModel(ob.dep)
        c = sm.components(ob.concurrency)
        S = c["per_stream_memory_raw"]
        a = ob.dep.arch
        self.tokens = c["micro_batch"] * c["tokens_per_stream"]
        self.n_experts, self.top_k = a.n_experts, a.top_k
        # seconds at nominal bandwidth per distinct expert per step (all MoE layers)
        self.per_expert = (sm.moe_layers * sm.expert_bytes / (ob.dep.hw.bandwidth_nominal * sm.expert_path.bandwidth_scale)
                           if a.is_moe else 0.0)
        self.default_skew = sm.skew
        touched = sm.experts_touched(self.tokens) if a.is_moe else 0.0
        self.fixed = (c["overhead_raw"], c["memory_raw"] - S - touched * self.per_expert, S,
                      c["compute_raw"] / compute_eff, c["comm_raw"], sm.emitted_per_step)

    def at(self, skew: float | None) -> tuple:
        O, M, S, C, K, L = self.fixed
        if self.per_expert:
            s = self.default_skew if skew is None else skew
            M += distinct_experts(self.n_experts, self.top_k, self.tokens, s) * self.per_expert
        return O, M, S, C, K, L, self.default_skew


def fit_joint(observations: Sequence[Observation], base: Efficiency | None = None,
              fit_skew: bool = True) -> JointFit:
    base = base or Efficiency()
    obs = list(observations)
    engines = sorted({o.engine for o in obs})
    models = sorted({o.model for o in obs})
    terms = [_Terms(o, base.compute) for o in obs]
    # prior skew of each model: its published statistic (what the deployment resolves by default)
    prior_skew = {m: next(t.at(None)[6] for t, o in zip(terms, obs) if o.model == m) for m in models}
    skewed = [m for m in models if fit_skew and any(o.model == m and o.concurrency > 1 and o.dep.arch.is_moe
                                                     for o in obs)]
    names = (["bandwidth", "link"] + [f"overhead[{e}]" for e in engines] + [f"model_overhead[{m}]" for m in models]
             + [f"model_per_stream[{m}]" for m in models] + [f"skew[{m}]" for m in skewed])
    nm, ne = len(models), len(engines)
    mu = np.array([math.log(1 / base.bandwidth), math.log(base.link_scale)] + [math.log(base.overhead_scale)] * ne
                  + [0.0] * (2 * nm) + [prior_skew[m] for m in skewed])
    sd = np.array([SIGMA_MACHINE] * (2 + ne) + [SIGMA_MODEL_OVERHEAD] * nm + [SIGMA_MODEL_PER_STREAM] * nm
                  + [SIGMA_SKEW] * len(skewed))
    ei = {e: 2 + i for i, e in enumerate(engines)}
    mi = {m: 2 + ne + i for i, m in enumerate(models)}
    pi = {m: 2 + ne + nm + i for i, m in enumerate(models)}
    si = {m: 2 + ne + 2 * nm + i for i, m in enumerate(skewed)}

    def rates(theta):
        out = []
        for t, o in zip(terms, obs):
            skew = min(MAX_SKEW, max(0.0, theta[si[o.model]])) if o.model in si else None
            O, M, S, C, K, L, _ = t.at(skew)
            x, p = math.exp(theta[0]), math.exp(theta[pi[o.model]])
            step = (math.exp(theta[ei[o.engine]] + theta[mi[o.model]]) * O + x * M + p * (x * S + C)
                    + math.exp(theta[1]) * K)
            out.append(o.concurrency * L / step)
        return np.array(out)

    observed = np.array([o.rate for o in obs])

    def residuals(theta):
        return np.concatenate([np.log(rates(theta) / observed) / SIGMA_RATE, (theta - mu) / sd])

    theta, lam = mu.copy(), 1e-2
    r = residuals(theta)
    for _ in range(40):  # Levenberg-Marquardt with a forward-difference Jacobian
        J = np.empty((len(r), len(theta)))
        for j in range(len(theta)):
            d = np.zeros_like(theta)
            d[j] = 1e-4
            J[:, j] = (residuals(theta + d) - r) / 1e-4
        g, H = J.T @ r, J.T @ J
        step = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-9), -g)
        trial = theta + step
        rt = residuals(trial)
        if rt @ rt < r @ r:
            theta, r, lam = trial, rt, lam / 3
            if np.max(np.abs(step)) < 1e-6:
                break
        else:
            lam *= 10
            if lam > 1e8:
                break
    machine = {e: Efficiency(bandwidth=math.exp(-theta[0]), compute=base.compute,
                             overhead_scale=math.exp(theta[ei[e]]), source="calibrated (machine factors)",
                             link_scale=math.exp(theta[1]))
               for e in engines}
    factors = {m: ModelFactors(routing_skew=(min(MAX_SKEW, max(0.0, float(theta[si[m]]))) if m in si else None),
                               overhead_scale=math.exp(theta[mi[m]]), per_stream_scale=math.exp(theta[pi[m]]))
               for m in models}
    err = np.log(rates(theta) / observed)
    return JointFit(machine=machine, link_scale=math.exp(theta[1]), models=factors, rms_log_error=float(np.sqrt(np.mean(err ** 2))),
                    n_observations=len(obs), fitted=[n for n, t, m in zip(names, theta, mu) if abs(t - m) > 1e-9])
