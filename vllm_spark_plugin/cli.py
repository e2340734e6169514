"""`vllm-spark`: one command, one sub-command per job.

Sub-commands are imported lazily so `vllm-spark knee` does not pay for importing torch/vLLM.
Each sub-command module exposes `add_arguments(parser)` and `run(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("vllm_spark_plugin.testbed.demo", "serve the tiny local model with the plugin, sweep it, report, show live metrics"),
    "tiny-model": ("vllm_spark_plugin.testbed.tiny_model", "build the tiny Qwen3-MoE test model and tokenizer (deterministic, offline)"),
    "serve": ("vllm_spark_plugin.testbed.serve_cli", "start a CPU/GPU vLLM OpenAI server with the plugin and wait for health"),
    "bench": ("vllm_spark_plugin.bench.cli", "concurrency sweep / closed-loop benchmark with the seed definitions"),
    "knee": ("vllm_spark_plugin.knee.cli", "fit the step-time model, knee and capacity to sweep results"),
    "plan": ("vllm_spark_plugin.plan.cli", "predict memory fit, curve, knee and capacity from model and hardware specs"),
    "dashboards": ("vllm_spark_plugin.grafana.cli", "regenerate the Grafana dashboards (and alert rules) with your SLOs"),
    "doctor": ("vllm_spark_plugin.doctor", "check the environment and print concrete fixes"),
    "check": ("vllm_spark_plugin.acceptance.cli", "acceptance run against your server: doctor, adaptive sweep, the planner's prediction beside it"),
    "convert-nvfp4": ("vllm_spark_plugin.quant.convert", "convert a bf16 Hugging Face checkpoint to ModelOpt NVFP4"),
    "tune-moe": ("vllm_spark_plugin.moe.tune", "produce tuned Triton fused-MoE configs on this GPU"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-spark", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    name = argv[0]
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"vllm-spark {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"vllm-spark {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `vllm-spark knee ... | head`: the reader left, not an error
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
