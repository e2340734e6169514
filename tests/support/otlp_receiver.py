"""A real OTLP/HTTP metrics endpoint for tests: decodes each export with opentelemetry-proto."""
from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest


class OtlpReceiver:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportMetricsServiceRequest()
                req.ParseFromString(body)
                with receiver.lock:
                    receiver.requests.append(req)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "OtlpReceiver":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()

    def latest_metrics(self) -> dict:
        """{metric name: Metric proto} from the most recent export."""
        with self.lock:
            if not self.requests:
                return {}
            req = self.requests[-1]
        out = {}
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = m
        return out
