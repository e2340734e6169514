"""Calibration that separates the machine/engine from the model, fitted over several models at once.

Why: fitted to one model's sweep, free machine factors absorb what belongs to that model (its routing
skew, its kernels' overhead) and carry it to every other model -- seed 001's two points gave a
bandwidth efficiency above 1.  Here each observed decode rate is explained by

    t(b) = s_engine * m_model * O + x * M(b; skew_model) + p_model * (x * S(b) + C(b) / compute) + K

with shared machine/engine factors (x = 1 / bandwidth efficiency, s_engine = overhead scale per
engine) and per-model factors (m_model = overhead multiplier, p_model = per-stream work multiplier
on the cache/state traffic S and the compute C, skew_model = routing skew).  With two or more models
the mean of their factors is held at 1, so what they share goes to the machine and what differs to
the models.  Both kinds have priors centred on the defaults (the published routing statistic for the skew); the fit is the
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
SIGMA_CENTRE = 0.02          # with 2+ models: their factors' mean stays at 1, what they share is the machine's
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


class _Layout:
    """Where each factor sits in the parameter vector, with its prior (mean, width)."""

    def __init__(self, obs: list, terms: list, base: Efficiency, fit_skew: bool):
        self.engines = sorted({o.engine for o in obs})
        self.models = sorted({o.model for o in obs})
        # prior skew of each model: its published statistic (what the deployment resolves by default)
        prior_skew = {m: next(t.default_skew for t, o in zip(terms, obs) if o.model == m) for m in self.models}
        self.skewed = [m for m in self.models if fit_skew and any(
            o.model == m and o.concurrency > 1 and o.dep.arch.is_moe for o in obs)]
        entries = [("bandwidth", math.log(1 / base.bandwidth), SIGMA_MACHINE),
                   ("link", math.log(base.link_scale), SIGMA_MACHINE)]
        entries += [(f"overhead[{e}]", math.log(base.overhead_scale), SIGMA_MACHINE) for e in self.engines]
        entries += [(f"model_overhead[{m}]", 0.0, SIGMA_MODEL_OVERHEAD) for m in self.models]
        entries += [(f"model_per_stream[{m}]", 0.0, SIGMA_MODEL_PER_STREAM) for m in self.models]
        entries += [(f"skew[{m}]", prior_skew[m], SIGMA_SKEW) for m in self.skewed]
        self.names = [n for n, _, _ in entries]
        self.mu = np.array([m for _, m, _ in entries])
        self.sd = np.array([w for _, _, w in entries])
        self.index = {n: i for i, n in enumerate(self.names)}

    def skew(self, theta, model: str) -> float | None:
        i = self.index.get(f"skew[{model}]")
        return None if i is None else min(MAX_SKEW, max(0.0, float(theta[i])))

    def value(self, theta, name: str) -> float:
        return math.exp(theta[self.index[name]])


def _rates(theta, lay: _Layout, obs: list, terms: list) -> np.ndarray:
    x, link = lay.value(theta, "bandwidth"), lay.value(theta, "link")
    out = []
    for t, o in zip(terms, obs):
        O, M, S, C, K, L, _ = t.at(lay.skew(theta, o.model))
        s = lay.value(theta, f"overhead[{o.engine}]") * lay.value(theta, f"model_overhead[{o.model}]")
        p = lay.value(theta, f"model_per_stream[{o.model}]")
        out.append(o.concurrency * L / (s * O + x * M + p * (x * S + C) + link * K))
    return np.array(out)


def _centring(theta, lay: _Layout) -> np.ndarray:
    """With two or more models, a deviation they all share belongs to the machine: the mean of each
    kind of model factor is held at 1 (log 0).  With one model the priors alone split it."""
    if len(lay.models) < 2:
        return np.zeros(0)
    out = []
    for kind in ("model_overhead", "model_per_stream"):
        idx = [lay.index[f"{kind}[{m}]"] for m in lay.models]
        out.append(float(np.mean(theta[idx])) / SIGMA_CENTRE)
    return np.array(out)


def _levenberg_marquardt(residuals, theta: np.ndarray, iterations: int = 40) -> np.ndarray:
    """Minimise |residuals(theta)|^2 with a forward-difference Jacobian."""
    r, lam = residuals(theta), 1e-2
    for _ in range(iterations):
        J = np.empty((len(r), len(theta)))
        for j in range(len(theta)):
            d = np.zeros_like(theta)
            d[j] = 1e-4
            J[:, j] = (residuals(theta + d) - r) / 1e-4
        g, H = J.T @ r, J.T @ J
        step = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-9), -g)
        rt = residuals(theta + step)
        if rt @ rt < r @ r:
            theta, r, lam = theta + step, rt, lam / 3
            if np.max(np.abs(step)) < 1e-6:
                break
        else:
            lam *= 10
            if lam > 1e8:
                break
    return theta


def fit_joint(observations: Sequence[Observation], base: Efficiency | None = None,
              fit_skew: bool = True) -> JointFit:
    """Maximum a posteriori machine/engine and model factors for observed decode rates."""
    base = base or Efficiency()
    obs = list(observations)
    terms = [_Terms(o, base.compute) for o in obs]
    lay = _Layout(obs, terms, base, fit_skew)
    observed = np.array([o.rate for o in obs])

    def residuals(theta):
        return np.concatenate([np.log(_rates(theta, lay, obs, terms) / observed) / SIGMA_RATE,
                               (theta - lay.mu) / lay.sd, _centring(theta, lay)])

    theta = _levenberg_marquardt(residuals, lay.mu.copy())
    machine = {e: Efficiency(bandwidth=1 / lay.value(theta, "bandwidth"), compute=base.compute,
                             overhead_scale=lay.value(theta, f"overhead[{e}]"),
                             source="calibrated (machine factors)", link_scale=lay.value(theta, "link"))
               for e in lay.engines}
    factors = {m: ModelFactors(routing_skew=lay.skew(theta, m),
                               overhead_scale=lay.value(theta, f"model_overhead[{m}]"),
                               per_stream_scale=lay.value(theta, f"model_per_stream[{m}]"))
               for m in lay.models}
    err = np.log(_rates(theta, lay, obs, terms) / observed)
    return JointFit(machine=machine, link_scale=lay.value(theta, "link"), models=factors,
                    rms_log_error=float(np.sqrt(np.mean(err ** 2))), n_observations=len(obs),
                    fitted=[n for n, t, m in zip(lay.names, theta, lay.mu) if abs(t - m) > 1e-9])
