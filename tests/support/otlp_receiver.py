"""A real OTLP/HTTP metrics endpoint for tests, in a process of its own: decodes each export with
opentelemetry-proto.

Its own process, so that a test process busy timing streaming clients never makes the server's
exports wait (an export the receiver answers late is a timed-out export, counted by the plugin).
The child keeps the latest export's body in a file (written whole, then renamed); the test reads it.

    python tests/support/otlp_receiver.py DIR   # what the parent runs; DIR/port, DIR/latest.pb
"""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _serve(directory: Path) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            tmp = directory / f"latest.pb.{os.getpid()}.{time.monotonic_ns()}"
            tmp.write_bytes(body)
            os.replace(tmp, directory / "latest.pb")
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *a):
            pass

    try:  # answer exports before the loads the tests run (as the test bed's clients do; root only)
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    (directory / "port.tmp").write_text(str(server.server_address[1]))
    os.replace(directory / "port.tmp", directory / "port")
    server.serve_forever()


class OtlpReceiver:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="otlp-receiver-"))
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "OtlpReceiver":
        self.proc = subprocess.Popen([sys.executable, __file__, str(self.dir)], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (self.dir / "port").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"OTLP receiver did not start (exit code {self.proc.poll()})")
            time.sleep(0.05)
        self.port = int((self.dir / "port").read_text())
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def latest_metrics(self) -> dict:
        """{metric name: Metric proto} from the most recent export."""
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        try:
            body = (self.dir / "latest.pb").read_bytes()
        except FileNotFoundError:
            return {}
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        out = {}
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = m
        return out


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
