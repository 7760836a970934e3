"""SGLang log strings (<=0.5.13 and 0.5.14+), in one place. Nothing else hard-codes a log string.

Each regex is guarded by a cheap substring (`*_KEY`) so that the parser only runs a regex on the
few lines that can match it: most engine output is access logs, batch stats and traceback frames.
"""

from __future__ import annotations

import re

from sglang_supervisor.core.events import FailureClass

# `[2026-05-01 12:00:00.123 DP0 TP1] msg`, `[12:00:00 TP0] msg` (2024 builds), `[2026-05-01 12:00:00] msg`.
# The optional `   21.249 NL ` lead is the fixtures' *.timed.log annotation (seconds, line end).
_STAMP = r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?"
_BRACKETS = _STAMP + r"((?: [A-Z][A-Z_]*\d+)*)\] ?"
HEADER = re.compile(r"^(?:\s*\d+\.\d+ (?:NL|CR) )?" + _BRACKETS)
# HEADER on a line that starts with `[` (the lead cannot match there): the cheaper regex for the
# bulk of the output.
BRACKET_HEADER = re.compile(_BRACKETS)
# A header somewhere inside a line: a `\r` progress frame glued in front of a real log line.
EMBEDDED_HEADER = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z][A-Z_]*\d+)*\] ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# -- startup -----------------------------------------------------------------------------------
SERVER_ARGS_KEY = "server_args="
SERVER_ARGS = re.compile(r"server_args=(?:ServerArgs\((?P<repr>.*)\)|\{(?P<dict>.*)\})\s*$")
DEPRECATED_KEY = "is deprecated"
DEPRECATED = re.compile(r"'(?P<flag>--[\w-]+)' is deprecated.*?(?:Use '(?P<new>[^']+)' instead)?\.?$")
WEIGHTS_BEGIN_KEY = "Load weight begin"
WEIGHTS_BEGIN = re.compile(r"Load weight begin\. avail mem=(?P<avail>[\d.]+) GB")
WEIGHTS_END_KEY = "Load weight end"
WEIGHTS_END = re.compile(
    r"Load weight end\.(?: elapsed=(?P<elapsed>[\d.]+) s)?.*?(?:mem usage=(?P<usage>[\d.]+) GB)?\.?$"
)
KV_KEY = "Cache is allocated"
# 0.4.3 prints sizes only (no #tokens): still the KV cache, its size unknown.
KV = re.compile(r"(?:^|\s)(?:Full |SWA )?KV Cache is allocated\.(?: .*?#tokens: (?P<tokens>\d+))?")

# -- graphs --------------------------------------------------------------------------------------
CAPTURE_KEY = "apture "
CAPTURE = re.compile(
    r"Capture (?P<owner>target|draft) (?P<phase>prefill|decode|verify|extend) "
    r"(?:CUDA|CPU|NPU|XPU|MUSA|cuda|cpu|npu|xpu|musa) "  # decode: the device's lower-case name
    r"graph (?P<state>begin|end)\.(?: backend=(?P<backend>\w+))?(?:.*?elapsed=(?P<elapsed>[\d.]+) s)?"
    r"(?:.*?mem usage=(?P<usage>[\d.]+) GB)?"
)
# <=0.5.13: decode graph, piecewise (prefill) graph, draft graphs.
LEGACY_CAPTURE = re.compile(
    r"Capture (?P<what>cuda|npu|cpu|musa|xpu|piecewise CUDA|draft cuda|draft extend cuda) graph "
    r"(?P<state>begin|end)"
    r"(?: \(step \d+\))?\."  # 0.5.9-0.5.13 multi-layer draft extend: `begin (step 2).`
    r"(?:.*?Time elapsed: (?P<elapsed>[\d.]+) s)?(?:.*?mem usage=(?P<usage>[\d.]+) GB)?"
)
LEGACY_KINDS = {
    "cuda": ("target", "legacy"),
    "npu": ("target", "legacy"),  # Ascend (0.5.x: `Capture npu graph begin.`)
    "cpu": ("target", "legacy"),
    "musa": ("target", "legacy"),
    "xpu": ("target", "legacy"),
    "piecewise CUDA": ("target", "piecewise"),
    "draft cuda": ("draft", "legacy"),
    "draft extend cuda": ("draft", "extend"),
}
PREFILL_DISABLED_KEY = "prefill CUDA graph"
PREFILL_DISABLED_LINE = "Disable prefill CUDA graph because"  # every rank, from 0.5.14 (engine/graphs)
# `... because REASON`, and 0.5.14's `... for EAGLE target on tc_piecewise ...` (engine/graphs).
PREFILL_DISABLED = re.compile(
    r"(?:Disable prefill CUDA graph (?:because |(?=for EAGLE target ))(?P<reason>.*)"
    r"|Breakable CUDA graph is incompatible with (?P<incompat>.*?); disabling prefill CUDA graph)"
)
# tqdm frames redrawn with \r while loading and capturing.
PROGRESS_WORDS = (
    "Capturing batches",
    "Capturing num tokens",
    "Capturing prefill shape",
    "Compiling num tokens",
    "Loading safetensors checkpoint shards",
    "Multi-thread loading shards",
)
PROGRESS_BAR = re.compile(r"\d+%\|")

# -- ready ---------------------------------------------------------------------------------------
SCHED_READY_KEY = "max_total_num_tokens="
SCHED_READY = re.compile(
    r"max_total_num_tokens=(?P<total>\d+).*?max_running_requests=(?P<running>\d+)"
    r"(?:.*?context_len=(?P<ctx>\d+))?"
)
HTTP_UP_KEY = "Uvicorn running on"
HTTP_UP = re.compile(r"Uvicorn running on (?:https?://)?(?P<host>\[[^\]]+\]|[^:\s]+):(?P<port>\d+)")
# uvicorn access log lines (`INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK`): never events.
ACCESS_LOG_PREFIX = "INFO:"
ACCESS_LOG_KEY = " HTTP/1."
READY_LINE = "The server is fired up and ready to roll!"

# -- request echoes (--log-requests) -----------------------------------------------------------
# Records that carry a user's text: `Receive: obj=GenerateReqInput(rid=..., text='...', ...)`,
# `Receive OpenAI: obj={...}`, `Finish: obj=..., out={...}` (0.4+; multimodal_gen too), 0.3.x's
# `in=GenerateReqInput(...), out={...}` and `--log-requests-format json`'s
# `{"timestamp": "...", "event": "request.received", ...}`. Only the start of a record says what
# it is: everything after it may be a prompt or a generated text, so nothing in it is an event.
ECHO_PREFIXES = ("Receive: obj=", "Receive OpenAI: obj=", "Finish: obj=", "in=", '{"timestamp": "')
LEGACY_ECHO = re.compile(r"in=\w+\(")
JSON_ECHO_EVENT = '", "event": "request.'
# SGLang prints the strings inside an echo with repr() (JSON escapes in the json form), so a real
# echo is one physical line ending with its closing bracket. One that does not end so was cut by
# another process's write, or is a raw-string form of an old build: the lines after it belong to
# it until one ends with a closing bracket (at most ECHO_CONTINUATION_LINES lines).
ECHO_CLOSERS = (")", "}")
ECHO_CONTINUATION_LINES = 1000
# Records of a failed *request* (user input inside; the engine keeps serving): they and the
# traceback printed right after them (logger.exception) are never engine failures.
REQUEST_ERROR_PREFIXES = (
    "[http_server] Error: ", "Error in request: ", "Exception in ASGI application",
    "ERROR:    Exception in ASGI application",
    # Records about one request whose text the user steers (the model's tool call or reasoning,
    # a request's lora_path, a client's disconnect): SGLang's own f-strings, 0.5.17 and 0.5.23.
    "Tool call parsing error: ", "Reasoning parsing error: ", "DS32EncodingError: ",
    "[http_server] Client disconnected: ", "Reloading evicted adapter: ",
)

# Where SGLang puts these records' key words: at the start of the message (after the header).
# Matching them anywhere in a line would read them inside any text that merely quotes them.
# 0.4.x spells it `proces.` / `proces(s).`: the prefix ends before the spelling differs.
CRASH_PREFIXES = ("Received sigquit from a child proces", "SIGQUIT received")

# -- serving -------------------------------------------------------------------------------------
DECODE_KEY = "Decode batch"
PREFILL_KEY = "Prefill batch"
# A read of nothing but serving chatter (`LogParser.feed_run`): each `\n`-ended line an access line
# or a stat line after a HEADER (its lead's spaces only ` ` or `\t`); `\x1b` is ruled out apart.
# Every line it accepts, `LogParser.feed_line`'s fast path reads as the same kind, with the same
# rank and message: a line it refuses only sends the read through line by line. The first form
# takes headers without a rank only (one pass tells a read has none), the second any header.
_CHATTER = ("(?:" + re.escape(ACCESS_LOG_PREFIX) + ".*" + re.escape(ACCESS_LOG_KEY) + "|"
            + re.escape(DECODE_KEY) + "|" + re.escape(PREFILL_KEY) + r").*\n")
_LEAD = r"(?:[ \t]*\d+\.\d+ (?:NL|CR) )?"
SERVING_RUN = re.compile("(?:" + _LEAD + _STAMP + r"\] ?" + _CHATTER + ")*")
SERVING_RUN_RANKED = re.compile("(?:" + _LEAD + _BRACKETS + _CHATTER + ")*")
RUNNING_REQ = re.compile(r"#running-req: (\d+)")
QUEUE_REQ = re.compile(r"#queue-req: (\d+)")
GEN_TPUT = re.compile(r"gen throughput \(token/s\): ([\d.]+)")
INPUT_TPUT = re.compile(r"input throughput \(token/s\): ([\d.]+)")
GRAPH_USED = re.compile(r"(?:cuda|cpu|npu|musa) graph: (True|False)")
ACCEPT_LEN = re.compile(r"accept len: ([\d.]+)")
# The whole batch stats lines as 0.5.x prints them, read by one regex; a line in any other shape
# (older or newer builds) falls back to the field regexes above, with the same result. Each field
# occurs once in these shapes, so the groups are what the field regexes would find.
DECODE_LINE = re.compile(
    r"Decode batch, #running-req: (\d+), #token: \d+, token usage: [\d.]+, "
    r"(?:accept len: ([\d.]+), accept rate: [\d.]+, )?"
    r"(?:cuda|cpu|npu|musa) graph: (True|False), gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)"
)
PREFILL_LINE = re.compile(
    r"Prefill batch, #new-seq: \d+, #new-token: \d+, #cached-token: \d+, token usage: [\d.]+, "
    r"#running-req: (\d+), #queue-req: (\d+), #pending-token: \d+, "
    r"(?:cuda|cpu|npu|musa) graph: (True|False), input throughput \(token/s\): ([\d.]+)"
)
DRAIN_KEYS = ("SIGTERM received", "Gracefully exiting")
# The shell's report of a process killed by SIGKILL (the OOM killer, the launcher's kill of its
# process tree after a sigquit): a line of its own, without a header.
KILLED_LINE = "Killed"

# -- failures ------------------------------------------------------------------------------------
TRACEBACK_START = "Traceback (most recent call last):"
SCHEDULER_EXCEPTION = "Scheduler hit an exception"
# 0.3/0.4 print a traceback after these, with a header on the first line only, like the above.
TP_EXCEPTIONS = ("Exception in run_tp_server:", "Exception in ModelTpServer:")
# The final line of a Python exception: `torch.OutOfMemoryError: ...`, `Exception: ...`.
# torch.compile's own exception names end otherwise (`torch._dynamo.exc.Unsupported`,
# `BackendCompilerFailed`): piecewise capture failures surface as those.
EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Unsupported|CompilerFailed)(?:: |$)"
)

CHILD_CRASHED = re.compile(r"Subprocess (?P<name>\S+) \(pid=\d+\) crashed with exit code (?P<code>-?\d+)")

UNKNOWN_SPEC_ALGORITHM = "Unknown speculative algorithm name"  # argparse accepts any name
# SGLang's refusal of a flag this machine cannot run, naming the flag to drop. 0.5.17 and 0.5.23
# (`initialize_moe_config`, on any GPU of compute capability 9.x): `ValueError: SBO (single batch
# overlap) is not supported on SM90 GPUs with latest sgl-deep-gemm wheel. Please try removing
# --enable-single-batch-overlap argument.`
FLAG_REFUSED_KEY = "Please try removing --"
FLAG_REFUSED = re.compile(r"Please try removing (?P<flag>--[A-Za-z0-9][\w-]*) argument")
# (substring, class) checked in order on every line that can be an error; first match wins.
SIGNATURES: tuple[tuple[str, FailureClass], ...] = (
    ("error: unrecognized arguments", FailureClass.UNKNOWN_FLAG),
    ("error: argument --", FailureClass.UNKNOWN_FLAG),
    ("error: ambiguous option", FailureClass.UNKNOWN_FLAG),
    (UNKNOWN_SPEC_ALGORITHM, FailureClass.UNKNOWN_FLAG),
    ("tc_piecewise was removed", FailureClass.UNKNOWN_FLAG),
    (FLAG_REFUSED_KEY, FailureClass.FLAG_REFUSED),
    # A JIT build (FlashInfer, sgl-kernel, torch extensions) without its build tool: torch's
    # `verify_ninja_availability` (`RuntimeError: Ninja is required to load C++ extensions`) and
    # subprocess's text when the tool is not on PATH. No profile change can supply the tool.
    ("Ninja is required to load C++ extensions", FailureClass.ENVIRONMENT),
    ("No such file or directory: 'ninja'", FailureClass.ENVIRONMENT),
    ("No such file or directory: 'nvcc'", FailureClass.ENVIRONMENT),
    # More of the host, never of a profile (issue 25; real lines in tests/fixtures/environment):
    # a cache directory the service user cannot write (triton's ~/.triton, flashinfer's
    # ~/.cache/flashinfer, TVM-FFI's, torch inductor's), a CUDA library the loader cannot find
    # (libcudart, libnvrtc, the driver's libcuda), triton without a C compiler, a JIT kernel
    # build that fails (torch's cpp_extension; a capture class instead while a capture runs).
    ("[Errno 13] Permission denied", FailureClass.ENVIRONMENT),
    ("[Errno 30] Read-only file system", FailureClass.ENVIRONMENT),
    ("cannot open shared object file", FailureClass.ENVIRONMENT),
    ("Failed to find C compiler", FailureClass.ENVIRONMENT),
    ("Error building extension '", FailureClass.ENVIRONMENT),
    ("Command '['ninja', '-v'", FailureClass.ENVIRONMENT),
    # A port lost to a race: the errno text as Python prints it, as uvicorn >= 0.30 prints it
    # (`[Errno 98] error while attempting to bind on address (...): address already in use`),
    # torch's TCPStore (`EADDRINUSE`, `errno: 98`) and SGLang's own precheck of its derived ports
    # (`Port is already in use. dist_init_port=...`, then `ValueError: port_base at 30001 is not
    # available in 30 seconds. ...`). Not its progress line while it waits (`port 30001 is in use.
    # Waiting for 11 seconds for port_base to be available. ...`): the port may still come free.
    ("Address already in use", FailureClass.PORT_IN_USE),
    ("address already in use", FailureClass.PORT_IN_USE),
    ("[Errno 98]", FailureClass.PORT_IN_USE),
    ("errno: 98", FailureClass.PORT_IN_USE),
    ("EADDRINUSE", FailureClass.PORT_IN_USE),
    ("Port is already in use", FailureClass.PORT_IN_USE),
    ("port_base at ", FailureClass.PORT_IN_USE),
    ("_port at ", FailureClass.PORT_IN_USE),
    ("Fail when using backend: breakable for prefill runner", FailureClass.PREFILL_GRAPH_FAILED),
    ("Piecewise CUDA Graph failed with error", FailureClass.PREFILL_GRAPH_FAILED),
    ("Not enough memory. Please try to increase --mem-fraction-static", FailureClass.KV_CACHE_OOM),
    ("leave no GPU memory for the KV cache", FailureClass.KV_CACHE_OOM),
    ("Capture prefill CUDA graph failed", FailureClass.PREFILL_GRAPH_FAILED),
    ("Capture frozen-KV MTP cuda graph failed", FailureClass.DRAFT_CAPTURE_FAILED),
    ("Capture cuda graph failed", FailureClass.CAPTURE_FAILED),  # refined to OOM / draft
    ("Capture CPU graph failed", FailureClass.CAPTURE_FAILED),
    ("torch._dynamo.exc.Unsupported", FailureClass.PREFILL_GRAPH_FAILED),  # piecewise torch.compile
    ("scheduler died during initialization", FailureClass.SCHEDULER_DIED),
    ("Initialization failed. warmup error", FailureClass.WARMUP_FAILED),
    ("Scheduler watchdog timeout", FailureClass.WATCHDOG_TIMEOUT),
    ("Watchdog timeout (self.watchdog_timeout=", FailureClass.WATCHDOG_TIMEOUT),  # <= 0.5.5
    ("watchdog timeout (self.watchdog_timeout=", FailureClass.WATCHDOG_TIMEOUT),  # any debug_name
    ("Watchdog caught collective operation timeout", FailureClass.NCCL_TIMEOUT),
    ("c10::DistBackendError", FailureClass.NCCL_TIMEOUT),
    ("NCCL timeout", FailureClass.NCCL_TIMEOUT),
    ("CUDA error:", FailureClass.CUDA_ERROR),
    ("an illegal memory access was encountered", FailureClass.CUDA_ERROR),
    ("CUBLAS_STATUS_", FailureClass.CUDA_ERROR),
)
# Cheap gate before scanning SIGNATURES: every signature contains one of these.
SIGNATURE_GATE = (
    "error",
    "Error",
    "Unknown",
    "removed",
    "removing",
    "Ninja",
    "No such file",
    "Errno",
    "shared object",
    "compiler",
    "extension",
    "Command '",
    "Address",
    "address",
    "Errno",
    "errno",
    "EADDRINUSE",
    "Port is",
    "port_base at",
    "_port at",
    "Fail",
    "failed",
    "memory",
    "died",
    "watchdog",
    "Watchdog",
    "NCCL",
    "CUBLAS",
    "Unsupported",
)
OOM_WORDS = ("out of memory", "OutOfMemoryError")
# Traceback frames that place an exception inside graph capture, or inside the draft model.
CAPTURE_FRAME_WORDS = ("cuda_graph", "init_cuda_graphs", "capture")
# A frame's source line that calls into graph capture (0.4.x `self.init_cuda_graphs()`, 0.5.x
# `self.init_device_graphs()`, the runner's `self.capture()`): where a traceback cut before its
# next frame stopped. Exact calls, not words: a source line is any code.
CAPTURE_CALL_WORDS = ("init_cuda_graphs(", "init_device_graphs(", "self.capture()", "CudaGraphRunner(")
DRAFT_FRAME_WORDS = ("speculative/", "draft")
PREFILL_FRAME_WORDS = ("prefill_cuda_graph", "breakable_cuda_graph", "piecewise")

# What to do about each class: shown by logscan next to the failure.
FIX_HINTS: dict[FailureClass, str] = {
    FailureClass.UNKNOWN_FLAG: "fix the command line for this SGLang version "
    "(sglang-supervisor render shows the migrated flags)",
    FailureClass.FLAG_REFUSED: "SGLang refuses the flag it names on this GPU or build: remove it from "
    "the profile (keep a rung without it in the ladder for this machine)",
    FailureClass.PORT_IN_USE: "another process holds the port: stop it or change --port",
    FailureClass.ENVIRONMENT: "the host lacks a build tool SGLang's JIT kernels need: install it into "
    "the engine's venv (`pip install ninja`) or put the CUDA toolkit's bin (nvcc) on the unit's PATH",
    FailureClass.PREFILL_GRAPH_FAILED: "use a profile with --cuda-graph-backend-prefill disabled, or lower "
    "--mem-fraction-static / --cuda-graph-max-bs-prefill if it is an OOM",
    FailureClass.CAPTURE_OOM: "lower --mem-fraction-static (e.g. 0.8) or --cuda-graph-max-bs-decode "
    "(e.g. 16); check that no other process uses the GPU",
    FailureClass.CAPTURE_FAILED: "lower --cuda-graph-max-bs-decode, or --cuda-graph-backend-decode disabled "
    "(large performance loss)",
    FailureClass.DRAFT_CAPTURE_FAILED: "use a profile without speculative decoding, or fix the environment "
    "the draft graph needs",
    FailureClass.KV_CACHE_OOM: "raise --mem-fraction-static, lower --context-length, or free GPU memory",
    FailureClass.SCHEDULER_DIED: "a rank was killed during init: check `dmesg -T | grep -i oom` (host RAM)",
    FailureClass.WARMUP_FAILED: "the warmup request failed after capture: usually GPU memory; "
    "lower --mem-fraction-static",
    FailureClass.WATCHDOG_TIMEOUT: "a forward batch hung: check GPU health and NCCL; restart",
    FailureClass.NCCL_TIMEOUT: "a collective timed out: check NVLink/P2P, NCCL env and the other ranks",
    FailureClass.SCHEDULER_EXCEPTION: "read the traceback above the failure line",
    FailureClass.CHILD_CRASHED: "a child process died (often killed by the OOM killer or a signal); "
    "check dmesg and restart",
    FailureClass.CUDA_ERROR: "a CUDA error: check the driver, GPU health (nvidia-smi -q) and recent flags",
    FailureClass.HANG: "no progress: check GPU health and lower the load",
    FailureClass.WEDGED: "alive but not serving: restart it",
    FailureClass.GPU_BUSY: "another process holds the GPU memory",
    FailureClass.OTHER: "read the lines around the failure",
}

# Secrets SGLang prints unredacted (server_args dump, /server_info, our own argv).
REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"""(\b\w*api_key\s*=\s*)(['"])(?:(?!\2).)*\2"""), r"\1\2***\2"),
    (re.compile(r"""(['"]\w*api_key['"]\s*:\s*)(['"])(?:(?!\2).)*\2"""), r"\1\2***\2"),
    (re.compile(r"(--(?:admin-)?api-key(?:=|\s+))(?!\*\*\*)\S+"), r"\1***"),
    (re.compile(r"(\bBearer\s+)(?!\*\*\*)[^\s'\",}]+"), r"\1***"),
)
SECRET_ARG_KEYS = ("api_key", "secret", "password", "hf_token")

# -- multi-node worker (--nnodes > 1, --node-rank > 0) -------------------------------------------
# SGLang's worker launcher logs this once all its schedulers are ready (after their captures),
# as `launch_dummy_health_check_server` starts: up to 0.5.4 `Starting dummy health check server
# at H:P` (`Dummy health check server scheduled on existing loop at H:P` inside a running loop),
# 0.5.5 and later (0.5.13, 0.5.17, 0.5.23 checked) `Dummy health check server started in
# background thread at H:P`. Not `... stopped at` nor `... failed to start`: the server is gone.
WORKER_READY = re.compile(r"^\[[^\]]*\] (?:Starting dummy health check server|"
                          r"Dummy health check server (?:scheduled on existing loop|"
                          r"started in background thread)) at ")
# The scheduler processes retitle themselves `sglang::scheduler_TP<n>`; a comm name is cut to 15
# bytes (`sglang::schedul`), so match on a prefix.
SCHEDULER_COMM_PREFIX = "sglang::sched"


# The fix for each kind of environment failure, by the text of its line (first match wins);
# FIX_HINTS[ENVIRONMENT] (a build tool) otherwise.
ENVIRONMENT_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("[Errno 13] Permission denied", "[Errno 30] Read-only file system"),
     "a directory the engine writes is not writable by the service user (the line names it; "
     "usually a JIT cache: triton ~/.triton, flashinfer ~/.cache/flashinfer, TVM-FFI, torch "
     "inductor): give the unit a writable HOME or XDG_CACHE_HOME, or point TRITON_CACHE_DIR / "
     "TORCHINDUCTOR_CACHE_DIR at a writable directory in engine.env"),
    (("cannot open shared object file",),
     "a CUDA library the engine loads is missing (the line names it): install the matching CUDA "
     "runtime into the engine's venv (nvidia-cuda-runtime / nvidia-cuda-nvrtc wheels) or add its "
     "directory to LD_LIBRARY_PATH in engine.env; libcuda.so.1 comes with the NVIDIA driver"),
    (("Failed to find C compiler",),
     "triton compiles its launchers with a C compiler: install gcc (build-essential) or set CC "
     "in engine.env"),
    (("Error building extension '", "Command '['ninja', '-v'"),
     "a JIT kernel build failed: the compiler's output above it in the engine log says why (a "
     "CUDA toolkit that does not match torch's, missing headers); fix the toolchain, then start again"),
)
JIT_BUILD_FAILED = ("Error building extension '", "Command '['ninja', '-v'")


def environment_fix(message: str) -> str:
    """What the operator does about an `environment` failure that `message` shows."""
    return next((fix for keys, fix in ENVIRONMENT_FIXES if any(k in message for k in keys)),
                FIX_HINTS[FailureClass.ENVIRONMENT])


def refused_flag(message: str) -> str | None:
    """The flag SGLang asked to remove in a `flag_refused` failure line, else None."""
    m = FLAG_REFUSED.search(message)
    return m.group("flag") if m is not None else None


# SGLang's own start-up lines in its line format, for telling that its log went to stdout (a
# logging config of the user's own): a line of these, in the bracketed header, with nothing parsed
# from stderr. Request records and access lines never look like them, and they come only after
# the HTTP server is up, when stderr has long spoken.
_OWN_START_LINE = re.compile(
    r"^\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z][A-Z_]*\d+)*\] "
    r"(?:server_args=|Load weight begin\.|Init torch distributed|Capture (?:target|draft|cuda graph)"
    r"|KV Cache is allocated|The server is fired up)")


def looks_like_own_log(line: str) -> bool:
    """`line` (from the engine's stdout) is one of SGLang's own start-up log lines."""
    return _OWN_START_LINE.match(line) is not None
