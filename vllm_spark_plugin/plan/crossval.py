"""Cross-validation of the planner over the published Spark figures (`plan/published.json`).

Leave one group out (a source, or a model): the machine/engine factors (bandwidth efficiency, overhead
scale) are fitted to every figure of the other groups run on the same engine, then the held-out
figures are predicted with them; the model factors (routing skew, kernel paths, speculative decoding)
stay the held-out model's own.  The uncalibrated prediction uses the defaults and no figure at all.
This is the test that a calibration transfers: it must not make predictions for unseen setups worse.
"""
from __future__ import annotations

from functools import lru_cache
from statistics import median

from vllm_spark_plugin.plan.deployment import Deployment
from vllm_spark_plugin.plan.jointfit import JointFit, Observation, fit_joint
from vllm_spark_plugin.plan.published import deployment_for, entry_class, published_entries
from vllm_spark_plugin.plan.stepmodel import Efficiency, ModelFactors, StepModel

GROUPS = {"source": lambda e: e["source"], "model": lambda e: e["model"]}


@lru_cache(maxsize=None)
def _deployment(entry_id: str) -> Deployment:
    return deployment_for(_entries()[entry_id])


@lru_cache(maxsize=1)
def _entries() -> dict:
    return {e["id"]: e for e in published_entries()}


def observation(entry: dict) -> Observation:
    return Observation(dep=_deployment(entry["id"]), concurrency=int(entry.get("concurrency", 1)),
                       rate=float(entry["tokens_per_second"]), model=entry["model"],
                       engine=entry.get("engine_key", "vllm"))


def predict(entry: dict, eff: Efficiency, model: ModelFactors | None = None) -> float:
    sm = StepModel(_deployment(entry["id"]), eff, model)
    return sm.aggregate_rate(int(entry.get("concurrency", 1)))


def calibrated_factors(fit: JointFit, entry: dict) -> tuple[Efficiency, ModelFactors | None]:
    """The machine factors of the entry's engine (shared bandwidth if the engine was not seen) and the
    model's own factors if the model was seen."""
    engine = entry.get("engine_key", "vllm")
    eff = fit.machine.get(engine)
    if eff is None:
        any_eff = next(iter(fit.machine.values()))
        eff = Efficiency(bandwidth=any_eff.bandwidth, source="calibrated (bandwidth only)")
    return eff, fit.model_factors(entry["model"])


def cross_validate(by: str = "source") -> list[dict]:
    """One row per figure: published, uncalibrated and calibrated-on-the-other-groups predictions."""
    key = GROUPS[by]
    entries = list(_entries().values())
    rows = []
    for group in sorted({key(e) for e in entries}):
        held = [e for e in entries if key(e) == group]
        fit = fit_joint([observation(e) for e in entries if key(e) != group])
        for e in held:
            eff, mf = calibrated_factors(fit, e)
            pub = float(e["tokens_per_second"])
            unc, cal = predict(e, Efficiency()), predict(e, eff, mf)
            rows.append({"id": e["id"], "group": group, "class": entry_class(e), "published": pub,
                         "uncalibrated": unc, "calibrated": cal, "error_uncalibrated": unc / pub - 1,
                         "error_calibrated": cal / pub - 1, "bandwidth_efficiency": eff.bandwidth,
                         "overhead_scale": eff.overhead_scale,
                         "model_factors": None if mf is None else mf.to_dict()})
    return rows


def summary(rows: list[dict]) -> dict:
    """Median and worst absolute error, before and after calibration, overall and per class."""
    def stats(rs):
        u = [abs(r["error_uncalibrated"]) for r in rs]
        c = [abs(r["error_calibrated"]) for r in rs]
        return {"n": len(rs), "median_uncalibrated": median(u), "worst_uncalibrated": max(u),
                "median_calibrated": median(c), "worst_calibrated": max(c)}
    out = {"all": stats(rows)}
    for cls in sorted({r["class"] for r in rows}):
        out[cls] = stats([r for r in rows if r["class"] == cls])
    return out


def render(by: str = "source") -> str:
    s = summary(cross_validate(by))
    lines = [f"leave one {by} out: {'class':14} {'n':>3}  median before/after   worst before/after"]
    for cls, v in s.items():
        lines.append(f"{'':18}{cls:14} {v['n']:>3}  {v['median_uncalibrated'] * 100:6.1f}% / {v['median_calibrated'] * 100:5.1f}%"
                     f"   {v['worst_uncalibrated'] * 100:6.1f}% / {v['worst_calibrated'] * 100:5.1f}%")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m vllm_spark_plugin.plan.crossval
    print(render("source"))
    print(render("model"))
