"""sglang-sim as a process: startup, HTTP, faults, exit codes, and equivalence with real 0.5.17 logs.

Each test runs the simulator in its own session on a free port with fast simulated time and kills
its whole process group at the end. Deadlines are generous (a loaded CI box slows, not fails).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from seedargs import NEXTN_SPEC
from sglang_supervisor.core import logwatch
from sglang_supervisor.core.events import CaptureBegan, CaptureEnded, EngineFailed, PrefillGraphDisabled
from sglang_supervisor.engine.argv import tp_size
from sglang_supervisor.engine.graphs import expected_captures, settled_by_prefill_off

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.17-h200"
DEADLINE_S = 60.0
SCALE = "0.02"
READY_LINE = "The server is fired up and ready to roll!"
NEXTN = [
    "--model-path",
    "Qwen/Qwen3.6-27B",
    "--tp-size",
    "2",
    *NEXTN_SPEC,
    "--mamba-radix-cache-strategy",
    "extra_buffer",
    "--cuda-graph-backend-prefill",
    "breakable",
    "--enable-metrics",
    "--host",
    "127.0.0.1",
]
FIXTURE_FLAGS = [
    "--model-path",
    "/tmp/tiny",
    "--host",
    "127.0.0.1",
    "--attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--grammar-backend",
    "none",
    "--mem-fraction-static",
    "0.3",
    "--max-total-tokens",
    "65536",
    "--enable-metrics",
    "--cuda-graph-max-bs-decode",
    "16",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sim:
    def __init__(
        self, tmp: Path, argv: list[str], env: dict[str, str] | None = None, port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.err_path = tmp / f"sim-{self.port}.err"
        self.out_path = tmp / f"sim-{self.port}.out"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
        full_env.update({"SGLANG_SIM_TIME_SCALE": SCALE, "SGLANG_LOG_MS": "1", **(env or {})})
        with open(self.err_path, "wb") as err, open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sglang_supervisor.simulator", *argv, "--port", str(self.port)],
                stdout=out,
                stderr=err,
                env=full_env,
                start_new_session=True,
            )
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self) -> bytes:
        return self.err_path.read_bytes()

    def wait_log(self, text: str, timeout: float = DEADLINE_S) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not logged; rc={self.proc.poll()}\n{self.log()[-3000:]!r}")
            time.sleep(0.05)

    def wait_ready(self) -> None:
        self.wait_log(READY_LINE)

    def generate(self, max_new_tokens: int, timeout: float, text: str = "x") -> httpx.Response:
        """One plain /generate request (no stream, the engine's default sampling)."""
        return httpx.post(self.base + "/generate", timeout=timeout,
                          json={"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}})

    def wait_exit(self, timeout: float = DEADLINE_S) -> int:
        return self.proc.wait(timeout=timeout)

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def events(self, version: str | None = None) -> list[logwatch.EngineEvent]:
        return logwatch.parse_bytes(self.log(), version)


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[list[Sim]]:
    started: list[Sim] = []
    yield started
    for s in started:
        s.kill()


def start(
    sims: list[Sim], tmp: Path, argv: list[str], env: dict[str, str] | None = None, port: int | None = None
) -> Sim:
    sim = Sim(tmp, argv, env, port)
    sims.append(sim)
    return sim


def wait_gone(sim: Sim, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while sim.group_alive():
        assert time.monotonic() < deadline, "a process of the simulator's group outlived it"
        time.sleep(0.05)


def kinds(events: list[logwatch.EngineEvent]) -> list[str]:
    """Event kinds in order, noise dropped and repeats collapsed (ranks print the same lines)."""
    out: list[str] = []
    for e in events:
        name = type(e).__name__
        if name in ("CaptureProgress", "TracebackLine", "PrefillStats", "DecodeStats", "DeprecatedFlag"):
            continue
        if isinstance(e, CaptureBegan | CaptureEnded):
            name += f":{e.owner}/{e.phase}"
        if isinstance(e, EngineFailed):
            name += f":{e.failure.value}"
        if not out or out[-1] != name:
            out.append(name)
    return out


# -- the Done-when launch: TP=2 NEXTN --------------------------------------------------------


def test_tp2_nextn_launch_lifecycle(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(sims, tmp_path, NEXTN)
    refused_during_capture = 0
    while b"Uvicorn running" not in sim.log():
        assert sim.proc.poll() is None, sim.log()[-2000:]
        log = sim.log()
        if b"Capture target" in log and b"max_total_num_tokens" not in log:
            try:
                httpx.get(sim.base + "/health", timeout=1)
            except httpx.ConnectError:
                refused_during_capture += 1
            else:  # only possible once every rank finished capture
                assert b"max_total_num_tokens" in sim.log()
        time.sleep(0.02)
    assert refused_during_capture > 0
    sim.wait_ready()

    events = sim.events()
    ends = {(e.owner, e.phase, e.rank) for e in events if isinstance(e, CaptureEnded)}
    assert {("target", "verify", "TP0"), ("target", "verify", "TP1")} <= ends
    draft_ranks = {
        e.rank
        for e in events
        if isinstance(e, CaptureBegan) and e.phase in ("decode", "extend") and e.owner == "draft"
    }
    assert draft_ranks == {"TP0"}
    assert not any(
        isinstance(e, CaptureBegan) and e.owner == "target" and e.phase == "decode" for e in events
    )

    chunks: list[dict[str, object]] = []
    with httpx.stream(
        "POST",
        sim.base + "/generate",
        timeout=30,
        json={
            "text": "Write a story.",
            "stream": True,
            "sampling_params": {"max_new_tokens": 37, "ignore_eos": True, "temperature": 0},
        },
    ) as resp:
        assert resp.status_code == 200
        for raw in resp.iter_lines():
            if raw.startswith("data: ") and raw != "data: [DONE]":
                chunks.append(json.loads(raw[6:]))
            elif raw == "data: [DONE]":
                chunks.append({"done": True})
    assert chunks[-1] == {"done": True}
    texts = [str(c["text"]) for c in chunks[:-1]]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # cumulative
    meta = chunks[-2]["meta_info"]
    assert isinstance(meta, dict)
    assert meta["completion_tokens"] == 37
    assert meta["finish_reason"] == {"type": "length", "length": 37}
    assert meta["prompt_tokens"] > 0 and meta["e2e_latency"] > 0
    assert meta["spec_accept_length"] > 1.0 and 0 < meta["spec_accept_rate"] <= 1
    assert len(chunks) - 1 < 37  # tokens arrive in accept-length chunks

    metrics = httpx.get(sim.base + "/metrics", timeout=10).text
    for name in (
        "sglang:generation_tokens_total",
        "sglang:num_running_reqs",
        "sglang:gen_throughput",
        "sglang:cuda_graph_passes_total{",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:spec_accept_length",
    ):
        assert name in metrics
    assert httpx.get(sim.base + "/ready", timeout=10).status_code == 200

    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == 0
    wait_gone(sim)
    assert b"Gracefully exiting... Remaining number of requests 0." in sim.log()


# -- equivalence with the real 0.5.17 logs ----------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "extra", "faults"),
    [
        ("graphs.log", [], []),
        (
            "eager.log",
            ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"],
            [],
        ),
        (
            "standalone_spec.log",
            [
                "--speculative-algorithm",
                "STANDALONE",
                "--speculative-draft-model-path",
                "/tmp/tiny",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
            ],
            [],
        ),
        (
            "failures/decode_capture_oom.log",
            ["--cuda-graph-backend-prefill", "disabled"],
            ["capture-fail:decode"],
        ),
        ("failures/prefill_capture_oom.log", [], ["capture-fail:prefill"]),
        ("failures/kv_oom.log", [], ["kv-oom"]),
    ],
)
def test_same_event_sequence_as_the_real_log(
    sims: list[Sim], tmp_path: Path, fixture: str, extra: list[str], faults: list[str]
) -> None:
    env = {"SGLANG_SIM_VERSION": "0.5.17", "SGLANG_SIM_FAULTS": ",".join(faults)}
    sim = start(sims, tmp_path, [*FIXTURE_FLAGS, *extra], env)
    if faults:
        assert sim.wait_exit() == -9
    else:
        sim.wait_ready()
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.wait_exit() == -9  # 0.5.17 ends a clean drain with kill_process_tree(include_parent)
    real = kinds(logwatch.parse_bytes((FIXTURES / fixture).read_bytes(), "0.5.17"))
    assert kinds(sim.events("0.5.17")) == real


def test_crash_after_ready_matches_the_real_sequence(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(
        sims,
        tmp_path,
        [*FIXTURE_FLAGS, "--cuda-graph-backend-prefill", "disabled"],
        {"SGLANG_SIM_VERSION": "0.5.17", "SGLANG_SIM_FAULTS": "crash@1"},
    )
    assert sim.wait_exit() == -9
    wait_gone(sim)
    real = kinds(logwatch.parse_bytes((FIXTURES / "crash.log").read_bytes(), "0.5.17"))
    assert kinds(sim.events("0.5.17")) == real


# -- versions ---------------------------------------------------------------------------------


def test_removed_flag_exits_2_under_0_5_23_and_works_under_legacy(sims: list[Sim], tmp_path: Path) -> None:
    argv = ["--model-path", "/tmp/tiny", "--enforce-piecewise-cuda-graph"]
    modern = start(sims, tmp_path, argv)
    assert modern.wait_exit() == 2
    assert (
        modern.log()
        .rstrip()
        .endswith(b"sglang serve: error: unrecognized arguments: --enforce-piecewise-cuda-graph")
    )
    legacy = start(sims, tmp_path, argv, {"SGLANG_SIM_VERSION": "legacy"})
    legacy.wait_ready()
    assert b"Capture piecewise CUDA graph begin. avail mem=" in legacy.log()
    assert b"server_args=ServerArgs(" in legacy.log()
    assert httpx.get(legacy.base + "/ready", timeout=10).status_code == 404


# -- failures and signals ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "code", "text"),
    [
        (
            "capture-fail:verify:oom",
            -9,
            b"Received sigquit from a child process. It usually means the child failed.",
        ),
        ("capture-fail:draft-extend:error", -9, b"ModuleNotFoundError: No module named 'deep_gemm'"),
        (
            "crash:load+rank=1",
            1,
            b"RuntimeError: Rank 1 scheduler died during initialization (exit code: -9).",
        ),
        ("warmup-fail", -9, b"Initialization failed. warmup error:"),
    ],
)
def test_startup_failures_exit_like_sglang(
    sims: list[Sim], tmp_path: Path, fault: str, code: int, text: bytes
) -> None:
    sim = start(sims, tmp_path, NEXTN, {"SGLANG_SIM_FAULTS": fault})
    assert sim.wait_exit() == code
    assert text in sim.log()
    wait_gone(sim)


def test_port_in_use_is_uvicorns_bind_error(sims: list[Sim], tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        sim = start(sims, tmp_path, ["--model-path", "/tmp/tiny"], port=squatter.getsockname()[1])
        assert sim.wait_exit() == 3  # uvicorn's STARTUP_FAILURE, as under SGLang
    assert b"ERROR:    [Errno 98] error while attempting to bind on address" in sim.log()
    assert b"Traceback" not in sim.log()
    wait_gone(sim)


def test_nccl_timeout_aborts_the_rank_then_the_launcher(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(
        sims,
        tmp_path,
        ["--model-path", "/tmp/tiny", "--tp-size", "2"],
        {"SGLANG_SIM_FAULTS": "nccl-timeout@0+rank=1"},
    )
    assert sim.wait_exit() == -9
    log = sim.log()
    assert b"[rank1]:[E" in log and b"Watchdog caught collective operation timeout" in log
    assert b"Subprocess scheduler_1 (pid=" in log and b"crashed with exit code -6" in log
    wait_gone(sim)


def test_sigterm_before_http_kills_at_once(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(sims, tmp_path, NEXTN)
    sim.wait_log("Load weight begin")
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == -signal.SIGTERM
    wait_gone(sim)


def test_ignore_sigterm_needs_sigkill(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(sims, tmp_path, ["--model-path", "/tmp/tiny"], {"SGLANG_SIM_FAULTS": "ignore-sigterm"})
    sim.wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        sim.proc.wait(timeout=1.0)
    sim.proc.kill()
    assert sim.wait_exit() == -signal.SIGKILL
    wait_gone(sim)  # children follow through PDEATHSIG


def test_watchdog_fires_while_a_request_is_stuck(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(
        sims,
        tmp_path,
        ["--model-path", "/tmp/tiny", "--watchdog-timeout", "30"],
        {"SGLANG_SIM_FAULTS": "watchdog@0"},
    )
    sim.wait_ready()
    with contextlib.suppress(httpx.HTTPError):
        sim.generate(4, timeout=5)
    assert sim.wait_exit() == -9
    assert b"Scheduler watchdog timeout (self.watchdog_timeout=30, self.soft=False)" in sim.log()


def test_hang_while_serving_turns_health_503(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(sims, tmp_path, ["--model-path", "/tmp/tiny"], {"SGLANG_SIM_FAULTS": "hang:serving@0"})
    sim.wait_ready()
    assert httpx.get(sim.base + "/health", timeout=10).status_code == 503
    assert httpx.get(sim.base + "/model_info", timeout=10).status_code == 200
    assert b"Health check failed. Server couldn't get a response from detokenizer" in sim.log()


def test_eager_fallback_and_degrade_show_in_rates_and_logs(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(
        sims,
        tmp_path,
        ["--model-path", "/tmp/tiny", "--decode-log-interval", "10"],
        {"SGLANG_SIM_FAULTS": "eager-fallback@0,degrade:0.5@0"},
    )
    sim.wait_ready()
    time.sleep(0.2)
    info = httpx.get(sim.base + "/server_info", timeout=10).json()["sim"]
    assert info["eager"] is True and info["rate_multiplier"] == 0.5
    assert info["current_single_stream_tps"] == pytest.approx(info["single_stream_tps_eager"] * 0.5, rel=0.01)
    sim.generate(30, timeout=30)
    assert b"cuda graph: False, gen throughput" in sim.log()


def test_api_key_enforced_except_health_and_metrics(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(sims, tmp_path, ["--model-path", "/tmp/tiny", "--api-key", "s3cret", "--enable-metrics"])
    sim.wait_ready()
    assert b"'api_key': 's3cret'" in sim.log()  # SGLang prints it unredacted; the supervisor redacts
    assert httpx.get(sim.base + "/model_info", timeout=10).status_code == 401
    ok = httpx.get(sim.base + "/model_info", headers={"Authorization": "Bearer s3cret"}, timeout=10)
    assert ok.status_code == 200
    assert httpx.get(sim.base + "/health", timeout=10).status_code == 200
    assert httpx.get(sim.base + "/metrics", timeout=10).status_code == 200


def test_openai_routes(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(sims, tmp_path, ["--model-path", "/tmp/tiny"])
    sim.wait_ready()
    models = httpx.get(sim.base + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "/tmp/tiny"
    done = httpx.post(sim.base + "/v1/completions", json={"prompt": "hi", "max_tokens": 5}, timeout=10).json()
    assert done["usage"]["completion_tokens"] == 5
    chat = httpx.post(
        sim.base + "/v1/chat/completions",
        timeout=10,
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6},
    ).json()
    assert chat["usage"]["completion_tokens"] == 6
    assert httpx.post(sim.base + "/flush_cache", timeout=10).status_code == 200


def test_request_records_and_access_lines_on_stdout_the_log_on_stderr(sims: list[Sim], tmp_path: Path
                                                                      ) -> None:
    # SGLang 0.5.8+: the request logger's own StreamHandler(sys.stdout) and uvicorn's access
    # handler write to stdout; SGLang's log (ready line, uvicorn's startup) to stderr.
    sim = start(sims, tmp_path, ["--model-path", "/tmp/tiny", "--log-requests"])
    sim.wait_ready()
    r = sim.generate(2, timeout=10, text="hello there")
    assert r.status_code == 200
    deadline = time.monotonic() + DEADLINE_S
    while not all(t in sim.out_path.read_bytes() for t in (b"text='hello there'", b"POST /generate")):
        assert time.monotonic() < deadline, sim.out_path.read_bytes()[-2000:]
        time.sleep(0.05)
    out, err = sim.out_path.read_bytes(), sim.log()
    assert b"] Receive: obj=GenerateReqInput(rid=" in out and b"text='hello there'" in out
    assert b'"POST /generate HTTP/1.1" 200' in out
    assert b"Receive: obj=" not in err and b"Finish: obj=" not in err and b"POST /generate" not in err
    assert b"Uvicorn running on" in err and b"Uvicorn running on" not in out
    assert b"The server is fired up" not in out


def test_idle_server_uses_little_cpu(sims: list[Sim], tmp_path: Path) -> None:
    sim = start(sims, tmp_path, NEXTN)
    sim.wait_ready()
    time.sleep(0.5)

    def group_cpu_s() -> float:
        total = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == sim.proc.pid:  # field 5: pgrp
                    total += int(fields[11]) + int(fields[12])  # utime + stime
        return total / os.sysconf("SC_CLK_TCK")

    before, t0 = group_cpu_s(), time.monotonic()
    time.sleep(5)
    used = group_cpu_s() - before
    share = used / (time.monotonic() - t0)
    print(f"idle CPU of the simulated server's process group: {share:.2%} of one core")
    assert share < 0.05


@pytest.mark.parametrize(
    ("version", "extra"),
    [("0.5.14", []), ("0.5.14", ["--tp-size", "2", "--speculative-algorithm", "NEXTN"]),
     ("0.5.17", ["--tp-size", "2"]), ("0.5.23", ["--cuda-graph-backend-prefill", "disabled"]),
     ("0.5.23", ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"])],
)
def test_the_ready_gate_is_settled_by_what_the_engine_logs(sims: list[Sim], tmp_path: Path, version: str,
                                                          extra: list[str]) -> None:
    """engine/graphs' expected captures, per rank, are each ended or settled by a `Disable prefill
    CUDA graph because` line of that rank by the time the engine says it is ready."""
    argv = [*FIXTURE_FLAGS, *extra]
    sim = start(sims, tmp_path, argv, {"SGLANG_SIM_VERSION": version})
    sim.wait_ready()
    events = sim.events(version)
    ended = {(e.owner, e.phase, e.rank) for e in events if isinstance(e, CaptureEnded)}
    off = [e.rank for e in events if isinstance(e, PrefillGraphDisabled)]
    expected = expected_captures(argv, version, tp_size(argv))
    assert expected
    missing = [(c.owner, c.phase, r) for c in expected for r in c.ranks
               if (c.owner, c.phase, r) not in ended
               and not any(settled_by_prefill_off(c.phase, r, by) for by in off)]
    assert missing == []
