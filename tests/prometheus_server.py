"""A real Prometheus server (Debian package `prometheus`) on loopback for integration tests: it
scrapes the given targets every second, keeps its TSDB in a temporary directory and is stopped
(terminate, then kill) when the context ends. Queries go through its HTTP API."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tiers import apt_fix, require


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    require(binary is not None, "prometheus server not installed", apt_fix("prometheus"))
    assert binary is not None
    return binary


class Prometheus:
    def __init__(self, workdir: Path, proc: subprocess.Popen[bytes], port: int) -> None:
        self.workdir = workdir
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")

    def check_alive(self) -> None:
        assert self.proc.poll() is None, f"prometheus exited {self.proc.returncode}:\n{self.log()[-3000:]}"


@contextlib.contextmanager
def prometheus(workdir: Path, targets: list[str]) -> Iterator[Prometheus]:
    """Prometheus scraping `targets` ("host:port", path /metrics) every second."""
    binary = prometheus_binary()
    port = free_port()
    listed = ", ".join(f"'{t}'" for t in targets)
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: sglang-supervisor\n"
        f"    static_configs:\n      - targets: [{listed}]\n"
    )
    with (workdir / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'prometheus-data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=log,
        )
    try:
        yield Prometheus(workdir, proc, port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _result(resp: httpx.Response) -> list[dict[str, Any]]:
    # 503 while it starts (TSDB not ready), in plain text: an HTTPError the polling callers retry on
    if resp.status_code == 503:
        resp.raise_for_status()
    body = resp.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    """Instant query; `client` has the server's URL as base_url."""
    return _result(client.get("/api/v1/query", params={"query": expr}))


async def aquery(client: httpx.AsyncClient, expr: str) -> list[dict[str, Any]]:
    return _result(await client.get("/api/v1/query", params={"query": expr}))
