"""What every doctor check is handed: the environment, the planned serve arguments, the probe, the
server and rules to compare (`--endpoint`, `--rules`), and the readings several checks share
(CUDA, capability, FP4 backend imports, the plugin's settings), each read once on first use; a
reading that raises fails only the checks that need it."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from vllm_spark_plugin.doctor.probe import Probe
from vllm_spark_plugin.doctor.serve_args import ServeArgs


@dataclass
class Context:
    env: Mapping[str, str]
    serve: ServeArgs
    probe: Probe
    endpoint: str | None = None       # a running server's base URL (the floors check)
    rules: tuple[str, ...] = field(default=())  # rules files or folders (the floors check; default: the deploy's)

    @cached_property
    def cuda(self) -> bool:
        return bool(self.probe.has_cuda())

    @cached_property
    def capability(self) -> tuple | None:
        return self.probe.capability() if self.cuda else None

    @cached_property
    def backend_imports(self) -> dict:
        return self.probe.backend_imports()

    @cached_property
    def settings(self):
        """The SPARK_PLUGIN_* settings as the server reads them, the settings file included."""
        from vllm_spark_plugin import settings as settings_mod
        return settings_mod.load(self.env, announce=False)
