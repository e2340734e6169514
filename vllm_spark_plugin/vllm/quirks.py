"""Where vLLM releases differ in what the inbound side (`hooks/`) reads: one function per difference,
its docstring naming the releases each answer applies to (docs/vllm-releases.md has the per-release
facts).  `hooks/` calls these instead of carrying `getattr` fallbacks of its own, so adding a release
means reading this module, not the hooks.  Each is cheap enough for the per-step path: an attribute
read, no import, no probe.
"""
from __future__ import annotations


def cached_output_tokens(cached_reqs):
    """`SchedulerOutput.scheduled_cached_reqs.num_output_tokens` (a list per cached request), or None.

    Present in every release checked (0.26 to 0.34); a release without it (older than the window)
    gives None, and the step hook then counts a continuing chunked prefill as decode."""
    return getattr(cached_reqs, "num_output_tokens", None)


def has_unfinished_requests(scheduler) -> bool:
    """Requests are left to run on this scheduler.

    vLLM's own `get_num_unfinished_requests()` counts every waiting queue the release has: `waiting`
    plus `skipped_waiting` (0.26 to 0.30), plus `kv_holding_waiting` and `deferred_waiting` (0.31 on).
    A scheduler without it (none in 0.26 to 0.34) is judged by `running` and `waiting` alone."""
    count = getattr(scheduler, "get_num_unfinished_requests", None)
    if count is not None:
        return count() > 0
    return bool(getattr(scheduler, "running", None)) or bool(getattr(scheduler, "waiting", None))


def moe_backend_choice(moe_config) -> bool:
    """The MoE config carries vLLM's `--moe-backend` choice (`FusedMoEConfig.moe_backend`, which
    the plugin's GB10 policy may fill in when it is `auto`): every release from 0.26 to 0.34; a
    release without `--moe-backend` (older than the window) leaves the choice to vLLM."""
    return hasattr(moe_config, "moe_backend")
