# ruff: noqa: E501  (real log lines are long; wrapping them would change what is tested)
"""The engine log parser on real 0.5.17 output, on 0.5.23/legacy formats, and on hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    CaptureProgress,
    DecodeStats,
    DeprecatedFlag,
    EngineFailed,
    FailureClass,
    HttpUp,
    PrefillGraphDisabled,
    SchedulerReady,
    ServerArgsSeen,
    ServerReady,
    TracebackLine,
)
from sglang_supervisor.core.logwatch import (
    MAX_LINE_BYTES,
    LineSplitter,
    LogParser,
    parse_bytes,
    parse_lines,
    redact,
    root_failure,
    summarize,
)
from splitfeed import feed_in_pieces

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sglang-0.5.17-h200"

# Hand-checked against the raw logs: (file, ready, phase, failure class, failure line, crashed,
# capture kinds that ended, decode_cuda_graph, last_gen_throughput).
EXPECTED = [
    ("graphs.log", True, "serving", None, None, False, ["target prefill", "target decode"], True, 3930.36),
    ("graphs.timed.log", True, "serving", None, None, False, ["target prefill", "target decode"], True, 3930.36),
    ("eager.log", True, "serving", None, None, False, [], False, 2517.11),
    ("eager.timed.log", True, "serving", None, None, False, [], False, 2517.11),
    ("crash.log", True, "ready", "child_crashed", 54, True, ["target decode"], None, None),
    ("crash.timed.log", True, "ready", "child_crashed", 56, True, ["target decode"], None, None),
    ("ngram_frozen_scheduler.log", True, "serving", None, None, False, ["target prefill", "target verify"],
     True, 1115.04),
    ("standalone_spec.log", True, "serving", None, None, False,
     ["target prefill", "target verify", "draft prefill", "draft decode", "draft extend"], True, 911.33),
    ("qwen3-32b-shape/big_graphs.log", True, "serving", None, None, False, ["target prefill", "target decode"],
     True, 55.78),
    ("qwen3-32b-shape/big_eager.log", True, "serving", None, None, False, [], False, 29.65),
    ("failures/unknown_flag.log", False, "launching", "unknown_flag", 424, False, [], None, None),
    ("failures/deprecated_flags.log", True, "ready", None, None, False, ["target prefill", "target decode"],
     None, None),
    ("failures/kv_oom.log", False, "loading_weights", "kv_cache_oom", 42, True, [], None, None),
    ("failures/prefill_capture_oom.log", False, "capturing_graphs", "prefill_graph_failed", 24, True, [],
     None, None),
    ("failures/decode_capture_oom.log", False, "capturing_graphs", "capture_oom", 111, True, [], None, None),
    ("failures/oom_after_capture_at_warmup.log", False, "warming_up", "warmup_failed", 123, True,
     ["target decode"], None, None),
    ("failures/draft_extend_capture_import_error.log", False, "capturing_graphs", "draft_capture_failed", 228,
     True, ["target prefill", "target verify", "draft prefill", "draft decode"], None, None),
]


def test_every_fixture_log_is_covered() -> None:
    on_disk = {str(p.relative_to(FIX)) for p in FIX.rglob("*.log")}
    assert on_disk == {row[0] for row in EXPECTED}


@pytest.mark.parametrize("row", EXPECTED, ids=[r[0] for r in EXPECTED])
def test_fixture_summary(row: tuple) -> None:  # type: ignore[type-arg]
    name, ready, phase, cls, line, crashed, ended, graph, gen = row
    data = (FIX / name).read_bytes()
    summary = summarize(parse_bytes(data, "0.5.17")).to_json()
    assert summary["ready"] is ready
    assert summary["phase"] == phase
    assert summary["crashed"] is crashed
    assert summary["decode_cuda_graph"] == graph
    assert summary["last_gen_throughput"] == gen
    ends = [e["kind"] for e in summary["capture"]["events"] if e["state"] == "end"]
    assert ends == ended
    if cls is None:
        assert summary["failure"] is None
        assert summary["capture"]["failed"] is False
    else:
        assert summary["failure"]["class"] == cls
        assert summary["failure"]["line"] == line
    if name.startswith("failures/") and name != "failures/unknown_flag.log" and cls != "warmup_failed" \
            and cls is not None and cls != "kv_cache_oom":
        assert summary["capture"]["failed"] is True
    if name != "failures/unknown_flag.log":
        assert summary["tp_size"] == 1


def test_fixture_failure_lines_point_at_the_cause() -> None:
    data = (FIX / "failures" / "decode_capture_oom.log").read_bytes()
    splitter = LineSplitter()
    lines = splitter.feed(data) + splitter.flush()
    failure = root_failure(parse_bytes(data))
    assert failure is not None
    assert lines[failure.line_no - 1].startswith("Exception: Capture cuda graph failed: CUDA out of memory")


def test_deprecated_ansi_warnings_without_timestamp() -> None:
    events = parse_bytes((FIX / "failures" / "deprecated_flags.log").read_bytes())
    flags = [(e.flag, e.replacement) for e in events if isinstance(e, DeprecatedFlag)]
    assert flags == [("--enforce-piecewise-cuda-graph", "--cuda-graph-backend-prefill=tc_piecewise"),
                     ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")]


def test_fixture_progress_and_tracebacks_are_events() -> None:
    events = parse_bytes((FIX / "failures" / "decode_capture_oom.log").read_bytes())
    assert any(isinstance(e, CaptureProgress) and "Capturing batches" in e.what for e in events)
    assert sum(isinstance(e, TracebackLine) for e in events) > 50


# -- synthetic 0.5.23 / legacy formats -------------------------------------------------------

TP2_NEXTN = """\
[2026-05-01 12:00:00] server_args={'model_path': 'Qwen/Qwen3.6-27B', 'tp_size': 2, 'api_key': 'sk-123456', 'admin_api_key': None}
[2026-05-01 12:00:05 TP0] Load weight begin. avail mem=139.00 GB
[2026-05-01 12:00:05 TP1] Load weight begin. avail mem=139.00 GB
[2026-05-01 12:01:05 TP0] Load weight end. elapsed=60.00 s, type=Qwen3_5ForConditionalGeneration, avail mem=110.00 GB, mem usage=29.00 GB.
[2026-05-01 12:01:06 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 500000, K size: 10.00 GB, V size: 10.00 GB
[2026-05-01 12:01:07 TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8], avail mem=80.00 GB
[2026-05-01 12:01:07 TP1] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8], avail mem=80.00 GB
[2026-05-01 12:01:40 TP1] Capture target prefill CUDA graph end. elapsed=33.00 s, mem usage=1.00 GB, avail mem=79.00 GB.
[2026-05-01 12:01:40 TP0] Capture target prefill CUDA graph end. elapsed=33.10 s, mem usage=1.00 GB, avail mem=79.00 GB.
[2026-05-01 12:01:41 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=79.00 GB
[2026-05-01 12:01:41 TP1] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=79.00 GB
[2026-05-01 12:01:44 TP0] Capture target verify CUDA graph end. bs=[1, 2], elapsed=3.00 s, mem usage=0.10 GB, avail mem=78.90 GB.
[2026-05-01 12:01:44 TP1] Capture target verify CUDA graph end. bs=[1, 2], elapsed=3.00 s, mem usage=0.10 GB, avail mem=78.90 GB.
[2026-05-01 12:01:45 TP0] Capture draft prefill CUDA graph begin. backend=breakable, num_tokens=[4], avail mem=78.00 GB
[2026-05-01 12:01:45 TP1] Capture draft prefill CUDA graph begin. backend=breakable, num_tokens=[4], avail mem=78.00 GB
[2026-05-01 12:01:46 TP0] Capture draft prefill CUDA graph end. elapsed=1.00 s, mem usage=0.10 GB, avail mem=77.90 GB.
[2026-05-01 12:01:46 TP1] Capture draft prefill CUDA graph end. elapsed=1.00 s, mem usage=0.10 GB, avail mem=77.90 GB.
[2026-05-01 12:01:47 TP0] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1], avail mem=77.00 GB
[2026-05-01 12:01:49 TP0] Capture draft decode CUDA graph end. elapsed=2.00 s, mem usage=0.10 GB, avail mem=76.90 GB.
[2026-05-01 12:01:49 TP0] Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1], avail mem=76.00 GB
[2026-05-01 12:01:50 TP0] Capture draft extend CUDA graph end. elapsed=1.00 s, mem usage=0.10 GB, avail mem=75.90 GB.
[2026-05-01 12:01:50 TP0] max_total_num_tokens=500000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=262144, available_gpu_mem=75.90 GB
[2026-05-01 12:01:51] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)
[2026-05-01 12:02:00] The server is fired up and ready to roll!
[2026-05-01 12:02:10 TP0] Decode batch, #running-req: 1, #full token: 100, full token usage: 0.01, mamba num: 2, mamba usage: 0.01, accept len: 3.20, accept rate: 0.80, waiting-image-req: 0, cuda graph: True, gen throughput (token/s): 123.45, #queue-req: 0
"""


def test_tp2_nextn_0_5_23_run() -> None:
    events = parse_lines(TP2_NEXTN.splitlines(), "0.5.23")
    args = next(e for e in events if isinstance(e, ServerArgsSeen)).args
    assert args["tp_size"] == "2"
    assert args["api_key"] == "***"
    assert args["admin_api_key"] == "None"
    ends = [(e.owner, e.phase, e.rank) for e in events if isinstance(e, CaptureEnded)]
    assert ("draft", "extend", "TP0") in ends
    assert ("target", "verify", "TP1") in ends
    begins = [e for e in events if isinstance(e, CaptureBegan)]
    assert begins[0].backend == "breakable"
    ready = next(e for e in events if isinstance(e, SchedulerReady))
    assert (ready.max_total_num_tokens, ready.max_running_requests, ready.context_len) == (500000, 48, 262144)
    http = next(e for e in events if isinstance(e, HttpUp))
    assert (http.host, http.port) == ("0.0.0.0", 30000)
    decode = next(e for e in events if isinstance(e, DecodeStats))
    assert (decode.gen_throughput, decode.accept_len, decode.cuda_graph, decode.rank) == (123.45, 3.2, True, "TP0")
    summary = summarize(events).to_json()
    assert summary["tp_size"] == 2
    assert summary["capture"]["completed"] is True
    assert summary["phase"] == "serving"
    assert "sk-123456" not in repr(events)


def test_legacy_formats() -> None:
    lines = [
        "[12:00:00 TP0] server_args=ServerArgs(model_path='m', tp_size=2, api_key='secret-key')",
        "[12:00:01 TP0] Capture piecewise CUDA graph begin. avail mem=70.00 GB",
        "[12:00:09 TP0] Capture piecewise CUDA graph end. Time elapsed: 8.00 s. mem usage=1.00 GB. avail mem=69.00 GB.",
        "[12:00:10 TP1] Capture cuda graph begin. This can take up to several minutes. avail mem=69.00 GB",
        "[12:00:12 TP1] Capture cuda graph end. Time elapsed: 2.50 s. mem usage=0.50 GB. avail mem=68.50 GB.",
        "[12:00:13 TP0] Capture draft extend cuda graph begin. This can take up to several minutes.",
        "Decode batch. #running-req: 1, #token: 10, token usage: 0.00, gen throughput (token/s): 42.00, #queue-req: 0",
    ]
    events = parse_lines(lines, "0.5.13")
    assert next(e for e in events if isinstance(e, ServerArgsSeen)).args["api_key"] == "***"
    caps = [(type(e).__name__, e.owner, e.phase, e.rank) for e in events if isinstance(e, (CaptureBegan, CaptureEnded))]
    assert caps == [("CaptureBegan", "target", "piecewise", "TP0"), ("CaptureEnded", "target", "piecewise", "TP0"),
                    ("CaptureBegan", "target", "legacy", "TP1"), ("CaptureEnded", "target", "legacy", "TP1"),
                    ("CaptureBegan", "draft", "extend", "TP0")]
    ended = [e for e in events if isinstance(e, CaptureEnded)]
    assert (ended[0].elapsed_s, ended[1].mem_usage_gb) == (8.0, 0.5)
    assert next(e for e in events if isinstance(e, DecodeStats)).gen_throughput == 42.0


def test_dp_prefix_and_missing_timestamps() -> None:
    events = parse_lines([
        "[2026-05-01 12:00:00.123 DP1 TP0] Disable prefill CUDA graph because cuda_graph_config resolved x",
        "The server is fired up and ready to roll!",
    ])
    assert isinstance(events[0], PrefillGraphDisabled)
    assert events[0].rank == "DP1 TP0"
    assert isinstance(events[1], ServerReady)


def test_0_5_14_eagle_target_prefill_skip_settles_like_the_because_line() -> None:
    """Real 0.5.14 model_runner.init_prefill_cuda_graph: an EAGLE target on tc_piecewise."""
    events = parse_lines([
        "[2026-05-01 12:00:00 TP1] Disable prefill CUDA graph for EAGLE target on tc_piecewise to "
        "avoid FP4/MoE decode-replay corruption (#28386).",
    ])
    assert isinstance(events[0], PrefillGraphDisabled) and events[0].rank == "TP1"
    assert events[0].reason.startswith("for EAGLE target on tc_piecewise")


def test_joined_progress_frame_before_a_real_line() -> None:
    data = (b"\rCapturing batches (bs=16 avail_mem=1.00 GB):  10%|# | 1/6 [00:01<00:05]"
            b"[2026-05-01 12:00:00 TP0] Capture target decode CUDA graph end. elapsed=3.00 s, mem usage=0.1 GB\n")
    events = parse_bytes(data)
    assert [type(e) for e in events] == [CaptureProgress, CaptureEnded]
    assert events[1].rank == "TP0"


def test_wrapped_line_is_joined() -> None:
    events = parse_lines([
        "[2026-05-01 12:00:00 TP0] max_total_num_tokens=65536, chunked_prefill_size=8192, max_prefill_tok",
        "ens=16384, max_running_requests=4096, context_len=4096, available_gpu_mem=1.00 GB",
    ])
    assert isinstance(events[0], SchedulerReady)
    assert events[0].max_running_requests == 4096


@pytest.mark.parametrize(
    ("lines", "cls"),
    [
        (["[2026-05-01 12:00:00] ERROR:    [Errno 98] error while attempting to bind on address "
          "('0.0.0.0', 30000): Address already in use"], FailureClass.PORT_IN_USE),
        (["[2026-05-01 12:00:00] Rank 1 scheduler died during initialization (exit code: -9). If exit code "
          "is -9 (SIGKILL), a common cause is the OS OOM killer."], FailureClass.SCHEDULER_DIED),
        (["[2026-05-01 12:00:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"],
         FailureClass.WATCHDOG_TIMEOUT),
        (["[rank1]:[E501 12:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
          "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."],
         FailureClass.NCCL_TIMEOUT),
        (["[2026-05-01 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
          '  File "x.py", line 1, in forward', "RuntimeError: CUDA error: an illegal memory access was encountered",
          "[2026-05-01 12:00:01] Received sigquit from a child process. It usually means the child failed."],
         FailureClass.CUDA_ERROR),
        (["[2026-05-01 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
          '  File "pool_configurator.py", line 94, in configure',
          "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
          "mem_fraction_static=0.5"], FailureClass.KV_CACHE_OOM),
        (["[2026-05-01 12:00:00] Initialization failed. warmup error: Traceback (most recent call last):"],
         FailureClass.WARMUP_FAILED),
        (["[2026-05-01 12:00:00 TP0] Capture draft decode CUDA graph begin. backend=full, avail mem=1 GB",
          "[2026-05-01 12:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
          "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2 GiB"],
         FailureClass.DRAFT_CAPTURE_FAILED),
        (["[2026-05-01 12:00:00 TP0] Capture target decode CUDA graph begin. backend=full, avail mem=1 GB",
          "[2026-05-01 12:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
          "Exception: Capture cuda graph failed: invalid argument"], FailureClass.CAPTURE_FAILED),
        (["[12:00:00 TP0] Piecewise CUDA Graph failed with error: boom. add --disable-piecewise-cuda-graph"],
         FailureClass.PREFILL_GRAPH_FAILED),
        (["[2026-05-01 12:00:00] Unknown speculative algorithm name: MTP"], FailureClass.UNKNOWN_FLAG),
        # A JIT kernel build without its tool (torch.utils.cpp_extension's own text) inside a
        # capture: the environment, not a capture failure of the profile.
        (["[2026-05-01 12:00:00 TP0] Capture target decode CUDA graph begin. backend=full, avail mem=9 GB",
          "[2026-05-01 12:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
          '  File "cpp_extension.py", line 2000, in verify_ninja_availability',
          "RuntimeError: Ninja is required to load C++ extensions (pip install ninja to get it)"],
         FailureClass.ENVIRONMENT),
        (["[2026-05-01 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
          "FileNotFoundError: [Errno 2] No such file or directory: 'ninja'"], FailureClass.ENVIRONMENT),
        (["[2026-05-01 12:00:00] server_args={}", "Traceback (most recent call last):",
          "ValueError: something odd"], FailureClass.OTHER),
    ],
)
def test_failure_signatures(lines: list[str], cls: FailureClass) -> None:
    failure = root_failure(parse_lines(lines))
    assert failure is not None
    assert failure.failure is cls


def test_crash_after_ready_is_child_crashed_but_not_after_our_sigterm() -> None:
    base = ["[2026-05-01 12:00:00] The server is fired up and ready to roll!"]
    crash = "[2026-05-01 12:00:05] Subprocess scheduler_0 (pid=9) crashed with exit code -9. Triggering SIGQUIT..."
    assert summarize(parse_lines([*base, crash])).to_json()["failure"]["class"] == "child_crashed"
    drained = summarize(parse_lines([*base, "[2026-05-01 12:00:04] SIGTERM received. Draining requests", crash]))
    assert drained.failure is None
    assert drained.crashed is False


def test_redact() -> None:
    text = ("server_args=ServerArgs(api_key='abc123', admin_api_key=\"x\") {\"api_key\": \"k1\"} "
            "'api_key': 'k2' --api-key topsecret --admin-api-key=admsecret Authorization: Bearer tok.en mine")
    out = redact(text, ["mine"])
    for secret in ("abc123", '"x"', "k1", "k2", "topsecret", "admsecret", "tok.en", "mine"):
        assert secret not in out
    assert "api_key='***'" in out
    assert redact("api_key=None") == "api_key=None"


def test_parser_redacts_given_secrets_in_traceback_lines() -> None:
    events = LogParser(secrets=["hunter2"]).feed_line("Traceback (most recent call last): hunter2")
    assert "hunter2" not in repr(events)


# -- splitting ---------------------------------------------------------------------------------


def test_splitter_cr_lf_and_empty_frames() -> None:
    s = LineSplitter()
    assert s.feed(b"a\r\nb\rc") == ["a", "b"]
    assert s.feed(b"\n\n\r") == ["c"]
    assert s.flush() == []


def test_splitter_bounds_long_lines() -> None:
    s = LineSplitter(max_line=10)
    out = s.feed(b"x" * 25) + s.feed(b"yy\nshort\n")
    assert out[0].startswith("x" * 10)
    assert out[0].endswith("[...line cut by sglang-supervisor]")
    assert out[1:] == ["short"]
    assert MAX_LINE_BYTES == 64 * 1024


def test_splitter_invalid_utf8() -> None:
    assert LineSplitter().feed(b"\xff\xfeok\n") == ["\ufffd\ufffdok"]


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=1, max_value=50), max_size=40))
def test_splitting_is_chunking_invariant(data: bytes, cuts: list[int]) -> None:
    whole = LineSplitter()
    expected = whole.feed(data) + whole.flush()
    assert feed_in_pieces(LineSplitter(), data, cuts) == expected


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000))
def test_parser_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    events = parse_bytes(data)
    summarize(events)
    assert all(e.line_no >= 1 for e in events)


PIECES = st.sampled_from([
    b"\r", b"\n", b"\r\r\r", b"[2026-05-01 12:00:00 TP0] ", b"Capture target decode CUDA graph begin. ",
    b"Capturing batches (bs=8 avail_mem=1 GB):  50%|##| 3/6", b"Traceback (most recent call last):\n",
    b"Scheduler hit an exception: ", b"Exception: Capture cuda graph failed: out of memory", b"\x1b[1;33m",
    b"The server is fired up and ready to roll!", b"  File \"x.py\", line 1\n", b"\xff",
])


@settings(max_examples=150, deadline=None)
@given(st.lists(PIECES, max_size=60))
def test_parser_survives_cr_storms_and_joined_frames(pieces: list[bytes]) -> None:
    events = parse_bytes(b"".join(pieces))
    summary = summarize(events).to_json()
    assert isinstance(summary["ready"], bool)
    failures = [e for e in events if isinstance(e, EngineFailed)]
    assert all(isinstance(f.failure, FailureClass) for f in failures)
