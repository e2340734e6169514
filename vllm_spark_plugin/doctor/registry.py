"""Every `vllm-spark doctor` check, one row each, in the order the report prints them.

A row is the check's name and its function (`fn(ctx) -> Check | [Check] | None`, `ctx` a
`doctor.context.Context`).  `run_checks` runs every row under the same containment
(`check.contained`): an exception is one failed row naming the check and the exception, and the
other checks still run.  Adding a check is one function and one row here.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from vllm_spark_plugin.doctor import environment as e
from vllm_spark_plugin.doctor import floors
from vllm_spark_plugin.doctor.check import Check, contained
from vllm_spark_plugin.doctor.context import Context
from vllm_spark_plugin.doctor.probe import Probe
from vllm_spark_plugin.doctor.serve_args import ServeArgs


@dataclass(frozen=True)
class Row:
    name: str  # the row a failure of the check itself is reported under
    run: Callable[[Context], Check | Iterable[Check] | None]


def _unified_memory(ctx: Context):
    """Unified memory, driver events, VLLM_* variables vLLM does not know, CUDA-graph capture sizes
    (doctor/memory.py)."""
    from vllm_spark_plugin.doctor import memory
    return memory.checks(ctx.env, ctx.serve, ctx.probe, ctx.cuda)


def _links(ctx: Context):
    """The network links a multi-node deployment runs over (doctor/links.py)."""
    from vllm_spark_plugin.doctor import links
    return links.checks(ctx.env, ctx.serve, ctx.probe, ctx.settings.links)


CHECKS: tuple[Row, ...] = (
    Row("vllm", e.vllm_release),
    Row("plugin", e.plugin_entry_point),
    Row("device", e.device),
    Row("fp4_backends", e.fp4_backends),
    Row("fp4_kernel_payload", e.fp4_kernel_payload),
    Row("stale_env", e.stale_env),
    Row("settings", e.plugin_settings),
    Row("moe_setting", e.moe_setting),
    Row("memory", e.gpu_memory_utilization),
    Row("cuda_graphs", e.cuda_graphs),
    Row("tuned_configs", e.tuned_configs),
    Row("unified_memory", _unified_memory),
    Row(floors.NAME, floors.check),
    Row("links", _links),
)


def run_checks(env: Mapping[str, str] | None = None, serve: ServeArgs | None = None, probe: Probe | None = None,
               *, endpoint: str | None = None, rules: Iterable[str] = ()) -> list[Check]:
    """Every check's rows, in the order of CHECKS."""
    import os
    ctx = Context(os.environ if env is None else env, serve or ServeArgs(), probe or Probe(),
                  endpoint=endpoint, rules=tuple(rules))
    out: list[Check] = []
    for row in CHECKS:
        out += contained(row.name, row.run, ctx)
    return out
