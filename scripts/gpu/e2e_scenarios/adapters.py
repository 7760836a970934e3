"""The outside world of scripts/gpu/e2e.py: HTTP, streamed probes, /proc, NVML, the notify socket
systemd would own, the engine log as it grows and `sglang-supervisor run` as a child."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


def json_object(text: str) -> dict[str, Any]:
    """`text` as a JSON object; {} where it is none (not JSON, or a list, a number...)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def reap(proc: subprocess.Popen[Any], timeout: float) -> None:
    """Wait for `proc`; past `timeout`, SIGKILL its process group (it leads one) and wait again."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: Any = None, timeout: float = 10.0) -> tuple[int | None, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as f:
            return f.status, f.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:500]
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def stream_probe(base: str, max_new: int = 256) -> dict[str, Any]:
    """One streamed /generate: decode tok/s from the first to the last chunk (as realrun.py did)."""
    body = {"text": "The capital city of France is", "stream": True,
            "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0}}
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    chunks: list[float] = []
    last: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=120) as f:
        for raw in f:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunks.append(time.perf_counter() - t0)
            last = json.loads(line[5:])
    n = (last.get("meta_info") or {}).get("completion_tokens")
    dec = None
    if n and len(chunks) > 1 and chunks[-1] > chunks[0]:
        dec = (n - 1) / (chunks[-1] - chunks[0])
    return {"ttft_s": chunks[0] if chunks else None, "tokens": n, "decode_tok_s": dec}


def probe_series(base: str, runs: int, clock: Callable[[], float | None] = lambda: None
                 ) -> dict[str, Any]:
    stream_probe(base, 32)  # warm the path; not counted
    each = []
    for _ in range(runs):
        r = stream_probe(base)
        r["sm_clock_mhz_after"] = clock()
        each.append(r)
    tps = [e["decode_tok_s"] for e in each if e["decode_tok_s"]]
    return {"runs": each, "median_tok_s": statistics.median(tps) if tps else None}


def concurrent_streams(base: str, n: int = 8) -> None:
    """`n` streamed probes at once, so that SGLang prints `Decode batch` lines with a running
    batch; then half a second for those lines to reach the log."""
    threads = [threading.Thread(target=stream_probe, args=(base,)) for _ in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    time.sleep(0.5)


def server_info_gen(base: str) -> float | None:
    st, body = http(base + "/server_info", timeout=20)
    if st != 200:
        return None
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
        info = json.loads(body)
        states = info.get("internal_states") or [info]
        v = states[0].get("last_gen_throughput")
        return float(v) if v is not None else None
    return None


def proc_table() -> list[dict[str, Any]]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            comm = (d / "comm").read_text().strip()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out.append({"pid": int(d.name), "state": fields[0], "ppid": int(fields[1]),
                    "pgid": int(fields[2]), "comm": comm, "cmd": cmd})
    return out


def sglang_procs(zombies: bool = False) -> list[dict[str, Any]]:
    """Live sglang:: processes (or, with zombies=True, the exited-but-unreaped ones)."""
    return [p for p in proc_table() if ("sglang::" in p["cmd"] or p["comm"].startswith("sglang::"))
            and (p["state"] == "Z") == zombies]


def descendants(root: int) -> list[dict[str, Any]]:
    table = proc_table()
    found: list[dict[str, Any]] = []
    frontier = {root}
    while frontier:
        kids = [p for p in table if p["ppid"] in frontier]
        found += kids
        frontier = {p["pid"] for p in kids}
    return found


class Nvml:
    """Used GPU memory per device through NVML; inert without it (simulator machines)."""

    def __init__(self) -> None:
        self.nv: Any = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv = pynvml
        except Exception:
            self.nv = None

    def used(self, count: int) -> list[int] | None:
        if self.nv is None:
            return None
        return [int(self.nv.nvmlDeviceGetMemoryInfo(self.nv.nvmlDeviceGetHandleByIndex(i)).used)
                for i in range(count)]

    def sm_clock_mhz(self) -> float | None:
        if self.nv is None:
            return None
        h = self.nv.nvmlDeviceGetHandleByIndex(0)
        return float(self.nv.nvmlDeviceGetClockInfo(h, self.nv.NVML_CLOCK_SM))

    def describe(self) -> dict[str, Any]:
        if self.nv is None:
            return {}
        h = self.nv.nvmlDeviceGetHandleByIndex(0)
        name = self.nv.nvmlDeviceGetName(h)
        cc = self.nv.nvmlDeviceGetCudaComputeCapability(h)
        return {"gpu": name.decode() if isinstance(name, bytes) else name,
                "compute_capability": f"{cc[0]}.{cc[1]}",
                "driver": self.nv.nvmlSystemGetDriverVersion(),
                "gpu_count": self.nv.nvmlDeviceGetCount()}


class NotifySocket:
    """The datagram socket systemd would own: records every sd_notify message with its time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.time(), data.decode(errors="replace")))

    def times(self, key: str) -> list[float]:
        return [t for t, m in self.messages if any(line == key for line in m.split("\n"))]

    def close(self) -> None:
        self._stop = True
        self.thread.join(1)
        self.sock.close()


class FileTail:
    """Timestamps each line of a growing file (the engine log the supervisor writes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[tuple[float, str]] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pos = 0
        buf = b""
        while not self._stop:
            try:
                with self.path.open("rb") as f:
                    f.seek(pos)
                    data = f.read()
            except OSError:
                data = b""
            if data:
                pos += len(data)
                buf += data
                now = time.time()
                parts = re.split(rb"[\r\n]", buf)
                buf = parts.pop()
                self.lines += [(now, p.decode(errors="replace")) for p in parts if p.strip()]
            time.sleep(0.02)

    def since(self, t: float) -> list[tuple[float, str]]:
        return [x for x in self.lines if x[0] >= t]

    def close(self) -> None:
        self._stop = True
        self.thread.join(1)


class SupervisorRun:
    """`sglang-supervisor run` as systemd would start it, with its JSON log captured."""

    def __init__(self, python: str, config: dict[str, Any], workdir: Path, name: str,
                 environ: dict[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.config = config
        self.cfg_path = workdir / f"{name}.yaml"
        self.cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.notify = NotifySocket(workdir / "notify.sock")
        self.tail = FileTail(Path(config["engine"]["log_file"]))
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.log_path = workdir / "supervisor.log"
        self._log = self.log_path.open("w")
        env = dict(os.environ if environ is None else environ, NOTIFY_SOCKET=str(self.notify.path))
        self.t0 = time.time()
        self.proc = subprocess.Popen(
            [python, "-m", "sglang_supervisor", "run", "--config", str(self.cfg_path), "--log-format", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            now = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            self._log.write(f"{now - self.t0:9.3f} {line}\n")
            self._log.flush()
            try:
                doc = json.loads(line)
            except ValueError:
                doc = {"event": "raw", "text": line}
            if isinstance(doc, dict):
                self.events.append((now, doc))

    @property
    def metrics_url(self) -> str:
        return "http://" + self.config["metrics"]["address"]

    @property
    def engine_url(self) -> str:
        e = self.config["engine"]
        return f"http://{e['host']}:{e['port']}"

    def named(self, event: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, d) for t, d in self.events if d.get("event") == event]

    def status(self) -> dict[str, Any]:
        st, body = http(self.metrics_url + "/status", timeout=5)
        return json_object(body) if st == 200 else {}

    def wait(self, pred: Callable[[], bool], deadline: float, step: float = 0.1) -> bool:
        while time.time() < deadline:
            if pred():
                return True
            if self.proc.poll() is not None:
                return bool(pred())
            time.sleep(step)
        return bool(pred())

    def stop(self, timeout: float) -> tuple[int | str, float]:
        t = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc: int | str = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            rc = f"killed after {timeout:g} s"
            self.proc.wait(10)
        return rc, round(time.time() - t, 2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.stop(30)
        self.reader.join(5)
        self.notify.close()
        self.tail.close()
        self._log.close()


def proc_net() -> list[str]:
    out: list[str] = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            out += Path(name).read_text().splitlines()[1:]
    return out
