"""A real Prometheus server for tests: scrapes given targets every second from a temporary directory.

`PrometheusProcess` writes a config, starts `/usr/bin/prometheus` (Debian's 2.42) on a free loopback
port with its TSDB in the temporary directory, waits until it is ready, answers instant and range
queries through the HTTP API, and stops cleanly.  Nothing here is faked: the queries the dashboards
and rules use are run by the real PromQL engine against really scraped samples.

    with PrometheusProcess(["127.0.0.1:8000"]) as prom:
        prom.wait_for('up{job="vllm"} == 1', timeout=30)
        print(prom.query("sum(rate(vllm_spark_generation_tokens_total[1m]))"))
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Sequence

import yaml

PROMETHEUS_BINARY = "/usr/bin/prometheus"


class PromQueryError(RuntimeError):
    """Prometheus rejected a query (parse error, bad range, ...); the message carries its reason."""

    def __init__(self, expr: str, error_type: str, error: str):
        super().__init__(f"{error_type}: {error} (query: {expr})")
        self.expr = expr
        self.error_type = error_type
        self.error = error


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split_target(target: str) -> tuple[str, str, str]:
    """'http://127.0.0.1:8000/metrics' or '127.0.0.1:8000' -> (scheme, host:port, metrics path)."""
    if "://" not in target:
        return "http", target, "/metrics"
    u = urllib.parse.urlsplit(target)
    if not u.netloc:
        raise ValueError(f"scrape target {target!r} has no host:port")
    return u.scheme or "http", u.netloc, u.path or "/metrics"


class PrometheusProcess:
    """One Prometheus server scraping `targets` (URLs or host:port) under job `job` every `interval`."""

    def __init__(self, targets: Sequence[str] = (), *, job: str = "vllm", interval: str = "1s",
                 rule_files: Iterable[str | os.PathLike] = (), evaluation_interval: str = "1s",
                 binary: str = PROMETHEUS_BINARY, extra_args: Sequence[str] = (),
                 config_file: str | os.PathLike | None = None, env: dict[str, str] | None = None):
        """Either `targets` (a config is written) or `config_file` (used as it is, relative paths in it
        resolved from its directory, environment `env` added for external-label expansion)."""
        if not targets and config_file is None:
            raise ValueError("PrometheusProcess needs scrape targets or a config_file")
        self.targets = list(targets)
        self.config_file = Path(config_file).resolve() if config_file is not None else None
        self.env = dict(env or {})
        self.job = job
        self.interval = interval
        self.evaluation_interval = evaluation_interval
        self.rule_files = [str(Path(p).resolve()) for p in rule_files]
        self.binary = binary
        self.extra_args = list(extra_args)
        self.port: int | None = None
        self.workdir: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("Prometheus is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "prometheus.log"

    def config(self) -> dict:
        by_scheme_path: dict[tuple[str, str], list[str]] = {}
        for t in self.targets:
            scheme, hostport, path = _split_target(t)
            by_scheme_path.setdefault((scheme, path), []).append(hostport)
        scrape_configs = []
        for i, ((scheme, path), hosts) in enumerate(sorted(by_scheme_path.items())):
            scrape_configs.append({
                "job_name": self.job if i == 0 else f"{self.job}_{i}",
                "scheme": scheme,
                "metrics_path": path,
                "scrape_interval": self.interval,
                "scrape_timeout": self.interval,
                "static_configs": [{"targets": hosts}],
            })
        if len(scrape_configs) > 1:
            raise ValueError(f"targets {self.targets} differ in scheme or metrics path; "
                             "use one PrometheusProcess per kind")
        cfg: dict = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.evaluation_interval},
            "scrape_configs": scrape_configs,
        }
        if self.rule_files:
            cfg["rule_files"] = self.rule_files
        return cfg

    def start(self, timeout: float = 60.0) -> "PrometheusProcess":
        if not os.path.exists(self.binary):
            raise FileNotFoundError(f"{self.binary} not found: apt-get install prometheus")
        self.workdir = Path(tempfile.mkdtemp(prefix="vllm-spark-prom-"))
        if self.config_file is not None:
            cfg_path = self.config_file
        else:
            cfg_path = self.workdir / "prometheus.yml"
            cfg_path.write_text(yaml.safe_dump(self.config(), sort_keys=True))
        self.port = free_port()
        self._log = open(self.log_path, "wb")
        self._proc = subprocess.Popen(
            [self.binary, f"--config.file={cfg_path}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d",
             "--log.level=warn", *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir,
            env={**os.environ, **self.env}, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._proc.returncode}: {self._tail_log()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus not ready after {timeout}s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.workdir is not None and os.environ.get("VLLM_SPARK_KEEP_PROM") is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "PrometheusProcess":
        return self.start() if self._proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _tail_log(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    # -- HTTP API ------------------------------------------------------------------------------
    def _api(self, path: str, params: dict, expr: str = "") -> dict:
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400/422 carry the PromQL error in the body
            try:
                body = json.load(e)
            except ValueError:
                raise PromQueryError(expr, "http", f"HTTP {e.code}") from e
        if body.get("status") != "success":
            raise PromQueryError(expr, body.get("errorType", "?"), body.get("error", "?"))
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list:
        """Instant query; returns the result list (vector samples, or [scalar] for scalar results)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._api("/api/v1/query", params, expr)
        if data["resultType"] in ("scalar", "string"):
            return [data["result"]]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list:
        data = self._api("/api/v1/query_range",
                         {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}, expr)
        return data["result"]

    def wait_for(self, expr: str, timeout: float = 60.0,
                 predicate: Callable[[list], bool] = bool, interval: float = 0.5) -> list:
        """Poll `expr` until `predicate(result)` holds (default: non-empty); the last result."""
        deadline = time.monotonic() + timeout
        last: list = []
        while True:
            last = self.query(expr)
            if predicate(last):
                return last
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{expr!r} did not hold within {timeout}s; last result {last!r}")
            time.sleep(interval)

    def active_targets(self) -> list[dict]:
        with urllib.request.urlopen(self.url + "/api/v1/targets?state=active", timeout=10) as r:
            return json.load(r)["data"]["activeTargets"]

    def rule_groups(self) -> list[dict]:
        with urllib.request.urlopen(self.url + "/api/v1/rules", timeout=10) as r:
            return json.load(r)["data"]["groups"]


def sample_values(result: list) -> list[float]:
    """The float values of an instant-query vector result."""
    return [float(s["value"][1]) for s in result]
