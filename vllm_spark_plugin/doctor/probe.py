"""`Probe`: what doctor reads from vLLM and the machine, one field per reading, so a test replaces
exactly the readings this machine cannot give (a GB10, NVML) and nothing else."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Probe:
    """What doctor reads from vLLM and the machine; tests replace single fields (GPU, NVML)."""

    vllm_version: Callable[[], str] = None  # type: ignore[assignment]
    in_window: Callable[[], bool] = None  # type: ignore[assignment]
    capabilities: Callable[[], dict] = None  # type: ignore[assignment]
    has_cuda: Callable[[], bool] = None  # type: ignore[assignment]
    device_name: Callable[[], str] = None  # type: ignore[assignment]
    capability: Callable[[], tuple | None] = None  # type: ignore[assignment]
    backend_imports: Callable[[], dict] = None  # type: ignore[assignment]
    plugin_entry_points: Callable[[], list] = None  # type: ignore[assignment]
    meminfo_path: str = "/proc/meminfo"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from vllm_spark_plugin.vllm import capabilities, kernels, platform
        self.vllm_version = self.vllm_version or platform.vllm_version
        self.in_window = self.in_window or capabilities.in_window
        self.capabilities = self.capabilities or capabilities.all_capabilities
        self.has_cuda = self.has_cuda or platform.has_cuda
        self.device_name = self.device_name or platform.device_name
        self.capability = self.capability or platform.device_capability
        self.backend_imports = self.backend_imports or kernels.nvfp4_backend_imports
        self.plugin_entry_points = self.plugin_entry_points or general_plugin_names


def general_plugin_names() -> list[str]:
    from importlib.metadata import entry_points
    return sorted(ep.name for ep in entry_points(group="vllm.general_plugins"))
