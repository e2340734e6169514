"""What the installed vLLM is and where it runs: version, platform, device, config accessors.

Part of the outbound side of the vLLM port (what the plugin asks vLLM).  Every reader returns a
plain value or None and never raises: a renamed field degrades to "unknown".
"""
from __future__ import annotations


def vllm_version() -> str:
    try:
        import vllm
        return str(getattr(vllm, "__version__", "unknown"))
    except Exception:
        return "not installed"


def version_tuple(v: str | None = None) -> tuple[int, int]:
    v = v or vllm_version()
    try:
        major, minor = v.split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def has_cuda() -> bool:
    try:
        from vllm.platforms import current_platform
        return bool(current_platform.is_cuda())
    except Exception:
        return False


def num_gpu_blocks(vllm_config) -> int | None:
    n = getattr(getattr(vllm_config, "cache_config", None), "num_gpu_blocks", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def model_name(vllm_config) -> str:
    mc = getattr(vllm_config, "model_config", None)
    name = getattr(mc, "served_model_name", None) or getattr(mc, "model", None) or "unknown"
    if isinstance(name, (list, tuple)):
        name = name[0] if name else "unknown"
    return str(name)


def api_server_count(vllm_config) -> int:
    pc = getattr(vllm_config, "parallel_config", None)
    return int(getattr(pc, "_api_process_count", 1) or 1)


def device_name() -> str:
    try:
        from vllm.platforms import current_platform
        if current_platform.is_cpu():
            return "cpu"
        return str(current_platform.get_device_name())
    except Exception:
        return "unknown"


def device_capability() -> tuple[int, int] | None:
    try:
        from vllm.platforms import current_platform
        cap = current_platform.get_device_capability()
        return None if cap is None else (int(cap.major), int(cap.minor))
    except Exception:
        return None


def current_vllm_config():
    """The VllmConfig being built/served in this process (None outside vLLM's config context)."""
    try:
        from vllm.config import get_current_vllm_config_or_none
        return get_current_vllm_config_or_none()
    except Exception:
        return None

def environment_variable_names() -> set[str]:
    """The VLLM_* variables the installed vLLM reads (its own registry, `vllm.envs`)."""
    import vllm.envs as envs
    return set(envs.environment_variables)


def compiled_libraries() -> list[str]:
    """The compiled extension libraries (`*.so`) the installed vLLM ships, and FlashInfer's where it
    ships any (FlashInfer compiles most kernels at run time), found on disk without importing them."""
    import importlib.util
    from pathlib import Path

    out: list[str] = []
    for package in ("vllm", "flashinfer"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            out.extend(str(p) for p in sorted(Path(folder).rglob("*.so")))
    return out
