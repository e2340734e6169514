"""`vllm-spark serve`: start vLLM's OpenAI server with the plugin, wait for health, keep it up.

On a Spark this is plain `vllm serve MODEL` with the plugin allowed (VLLM_PLUGINS=spark); on a CPU
machine it adds the flags the CPU build needs.  Extra vLLM arguments go after `--`.
"""
from __future__ import annotations

import signal
import sys
import time

from vllm_spark_plugin.testbed.server import ServerStartError, VllmServer
from vllm_spark_plugin.testbed.tiny_model import SERVED_NAME, ensure_tiny_model


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, help="model folder or name (default: the tiny local test model)")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-plugin", action="store_true", help="serve without the plugin (for A/B comparisons)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for health")
    parser.add_argument("--log", default=None, help="server log file (default /tmp/vllm-server-PORT.log)")
    parser.add_argument("vllm_args", nargs="*", help="extra arguments for vLLM (after --)")


def run(args) -> int:
    model = args.model or str(ensure_tiny_model())
    name = args.served_model_name or (SERVED_NAME if args.model is None else model)
    server = VllmServer(model_path=model, served_name=name, port=args.port, plugin=not args.no_plugin,
                        extra_args=list(args.vllm_args), log_path=args.log)
    print(f"starting vLLM on {server.base_url} (log: {server.log_path}) ...", file=sys.stderr)
    try:
        server.start(timeout=args.timeout)
    except ServerStartError as exc:
        print(f"vllm-spark serve: {exc}", file=sys.stderr)
        return 1
    print(f"serving {name} on {server.base_url}; metrics: {server.metrics_url}; Ctrl-C stops", file=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while server.alive():
            time.sleep(1.0)
        print("vllm-spark serve: the server exited; last lines of its log:", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
