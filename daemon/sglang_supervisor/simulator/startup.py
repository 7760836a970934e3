"""The timed startup script of one simulated TP rank: a pure list of steps.

Order (SGLang's scheduler init): torch distributed, target weights, draft weights, memory pools,
target prefill graph, target decode (or verify) graph, draft prefill/decode/extend graphs (a hybrid
model's MTP draft logs why it has no prefill graph instead), then the
`max_total_num_tokens=` line on TP0. Progress bars and the draft decode/extend lines print on
TP0 only, as in SGLang (`log_info_on_rank0`). Durations are unscaled simulated seconds.

Long because: every rank's startup is one ordered script built by phase helpers that share _Phases
(clock, memory, faults, log lines); the order is SGLang's scheduler init, which the fixtures of real
logs check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sglang_supervisor.simulator import logfmt, throughput
from sglang_supervisor.simulator.args import SimConfig
from sglang_supervisor.simulator.faults import Fault
from sglang_supervisor.simulator.versions import LEGACY_PIECEWISE_FAIL_HINT

PREFILL_NUM_TOKENS = (
    4,
    8,
    12,
    16,
    20,
    24,
    28,
    32,
    48,
    64,
    80,
    96,
    112,
    128,
    144,
    160,
    176,
    192,
    208,
    224,
    240,
    256,
    288,
    320,
    352,
    384,
    416,
    448,
    480,
    512,
    576,
    640,
    704,
    768,
    832,
    896,
    960,
    1024,
    1280,
    1536,
    1792,
    2048,
    2304,
    2560,
    2816,
    3072,
    3328,
    3584,
    3840,
    4096,
    4608,
    5120,
    5632,
    6144,
    6656,
    7168,
    7680,
    8192,
)
OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 32.00 MiB. GPU {gpu} has a total capacity of {total:.2f} GiB "
    "of which 10.75 MiB is free. Including non-PyTorch memory, this process has {used:.2f} GiB memory "
    "in use. Of the allocated memory {alloc:.2f} GiB is allocated by PyTorch, and 29.35 MiB is reserved "
    "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# Real 0.5.17's reason for the hybrid (Qwen3.5/3.6) MTP draft's prefill graph.
DRAFT_PREFILL_OFF_HYBRID = "some layers do not apply Standard GQA"
# Real 0.5.14 (model_runner.init_prefill_cuda_graph), on every rank; NEXTN resolves to EAGLE.
EAGLE_TARGET_PREFILL_OFF = (
    "Disable prefill CUDA graph for EAGLE target on tc_piecewise to avoid FP4/MoE decode-replay "
    "corruption (#28386)."
)
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN")
CAPTURE_ERROR_TEXT = (
    "CUDA error: operation not permitted when stream is capturing\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


@dataclass(frozen=True, slots=True)
class Step:
    """log: a formatted SGLang line; raw: bytes as is (progress frames, traceback bodies);
    sleep: wait (simulated s); sigquit: tell the launcher this rank failed, then idle;
    die: SIGKILL this process; hang: stop forever; ready: report to the launcher, then idle."""

    kind: str
    text: str = ""
    seconds: float = 0.0


def _log(text: str) -> Step:
    return Step("log", text)


def _sleep(seconds: float) -> Step:
    return Step("sleep", seconds=seconds)


@dataclass(frozen=True, slots=True)
class Memory:
    """Per-rank GPU memory plan in GB."""

    total: float
    start_avail: float
    weights: float
    draft_weights: float
    kv: float
    kv_tokens: int
    prefill_graph: float
    decode_graph: float


def bytes_per_token(cfg: SimConfig) -> float:
    layers = throughput.num_layers(cfg.model_gb)
    full_attn_layers = max(1, layers // 4) if cfg.hybrid else layers
    return full_attn_layers * 2 * 8 * 128 * 2 / cfg.tp_size


def memory_plan(cfg: SimConfig) -> Memory:
    total = cfg.sim.gpu_gb
    start = total - 0.67
    weights = cfg.model_gb / cfg.tp_size
    draft = 0.0
    if cfg.spec_algorithm in ("EAGLE", "NEXTN", "EAGLE3"):
        draft = round(weights * 0.04, 2)
    elif cfg.has_draft_model:
        draft = weights
    kv = total * cfg.mem_fraction_static - (total - start) - weights - draft
    tokens = max(0, int(kv * 1e9 / bytes_per_token(cfg)))
    if cfg.max_total_tokens_flag is not None and kv > 0:
        tokens = min(tokens, cfg.max_total_tokens_flag)
        kv = tokens * bytes_per_token(cfg) / 1e9
    return Memory(
        total, start, weights, draft, kv, tokens, 0.14, 0.03 + 0.002 * cfg.max_running_requests**0.5
    )


def decode_batch_sizes(cfg: SimConfig) -> list[int]:
    max_bs = int(
        cfg.server_args.get("cuda_graph_max_bs_decode")
        or cfg.server_args.get("cuda_graph_max_bs")
        or min(cfg.max_running_requests, 256 if not cfg.speculative else 16)
    )
    base = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16] if cfg.speculative else [1, 2, 4, 8, 12, 16]
    sizes = [b for b in base if b <= max_bs] + list(range(24, max_bs + 1, 8))
    return sizes or [1]


def prefill_num_tokens(cfg: SimConfig) -> list[int]:
    """The prefill graph's token counts: SGLang's list, capped by the max the command sets."""
    sa = cfg.server_args
    raw = sa.get("cuda_graph_max_bs_prefill") or sa.get("piecewise_cuda_graph_max_tokens")
    top = int(raw) if raw not in (None, "", "None") else PREFILL_NUM_TOKENS[-1]
    return [n for n in PREFILL_NUM_TOKENS if n <= top] or [PREFILL_NUM_TOKENS[0]]


class _Record:
    """A value whose repr is SGLang's dataclass repr (`CudaGraphConfig(decode=PhaseConfig(...))`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def resolved_server_args(cfg: SimConfig) -> dict[str, Any]:
    """The server_args dump with what SGLang resolves in it (engine/resolved.py): the graph sizes
    as a per-phase record from 0.5.14 (a dict from 0.5.23), the flat `cuda_graph_max_bs` before."""
    args = dict(cfg.server_args)
    bs = decode_batch_sizes(cfg)
    tokens = prefill_num_tokens(cfg)
    if cfg.spec.capture_style == "legacy":
        if args.get("cuda_graph_max_bs") in (None, "None"):
            args["cuda_graph_max_bs"] = max(bs)
        return args
    phases = {"decode": (cfg.decode_backend, max(bs), bs),
              "prefill": (cfg.prefill_backend, max(tokens), tokens)}
    if cfg.spec.server_args_style == "dict":
        args["cuda_graph_config"] = {ph: {"backend": b, "max_bs": m, "bs": list(v)}
                                     for ph, (b, m, v) in phases.items()}
    else:
        inner = ", ".join(f"{ph}=PhaseConfig(backend={b!r}, max_bs={m}, bs={list(v)})"
                          for ph, (b, m, v) in phases.items())
        args["cuda_graph_config"] = _Record(f"CudaGraphConfig({inner})")
    return args


def _prefix(cfg: SimConfig, rank: int) -> str:
    return logfmt.rank_prefix(rank, cfg.tp_size)


def _timed_bar(desc_items: list[str], seconds: float) -> list[Step]:
    steps: list[Step] = []
    for delay, text in logfmt.progress_frames(desc_items, seconds):
        if delay:
            steps.append(_sleep(delay))
        steps.append(Step("raw", text))
    return steps


def _traceback(cfg: SimConfig, rank: int, inner: str, outer: str | None) -> list[Step]:
    """`Scheduler hit an exception: Traceback ...` as SGLang prints it, then SIGQUIT."""
    body = (
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/sglang/srt/managers/scheduler.py", line 6362, '
        "in run_scheduler_process\n    scheduler = Scheduler(\n                ^^^^^^^^^^\n"
        '  File "/usr/lib/python3/site-packages/sglang/srt/managers/scheduler.py", line 985, '
        "in init_model_worker\n    self.init_all_cuda_graphs()\n"
        f"{inner}\n"
    )
    if outer is not None:
        body += (
            "\nDuring handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/lib/python3/site-packages/sglang/srt/model_executor/runner/'
            'decode_cuda_graph_runner.py", line 417, in __init__\n    raise Exception(\n'
            f"{outer}\n"
        )
    return [_log(body), Step("sigquit")]


# Real 0.5.17 on an H200 (tests/fixtures/sglang-0.5.17-h200-seed/tuned-sbo-then-no-prefill-graph.
# engine.log): initialize_moe_config refuses single batch overlap on any SM90 GPU, for every model,
# in the scheduler's constructor, before any weight loads.
SBO_SM90_ERROR = (
    "ValueError: SBO (single batch overlap) is not supported on SM90 GPUs with latest "
    "sgl-deep-gemm wheel. Please try removing --enable-single-batch-overlap argument."
)


def refused_on_this_gpu(cfg: SimConfig) -> str | None:
    """The exception line real SGLang raises at scheduler start for a flag this GPU cannot run."""
    sm = cfg.sim.gpu_sm
    if sm is not None and int(sm) == 9 and cfg.server_args.get("enable_single_batch_overlap"):
        return SBO_SM90_ERROR
    return None


def _scheduler_init_traceback(inner: str) -> list[Step]:
    """`Scheduler hit an exception` raised from Scheduler.__init__ (the frames of the fixture)."""
    body = (
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/sglang/srt/managers/scheduler.py", line 4931, '
        "in run_scheduler_process\n    scheduler = Scheduler(\n                ^^^^^^^^^^\n"
        '  File "/usr/lib/python3/site-packages/sglang/srt/managers/scheduler.py", line 488, '
        "in __init__\n    self.init_moe_gemm_config()\n"
        '  File "/usr/lib/python3/site-packages/sglang/srt/managers/scheduler.py", line 873, '
        "in init_moe_gemm_config\n    initialize_moe_config(self.server_args)\n"
        '  File "/usr/lib/python3/site-packages/sglang/srt/layers/moe/utils.py", line 318, '
        "in initialize_moe_config\n    raise ValueError(\n"
        f"{inner}\n"
    )
    return [_log(body), Step("sigquit")]


def _oom(cfg: SimConfig, rank: int, mem: Memory) -> str:
    used = mem.total - mem.start_avail + mem.weights + mem.draft_weights + mem.kv
    return OOM_TEXT.format(gpu=rank, total=mem.total * 0.931, used=used, alloc=mem.weights + mem.kv)


# torch.utils.cpp_extension.verify_ninja_availability's text: a JIT kernel build (the first
# capture compiles sglang's kernels) on a host without ninja.
NO_NINJA_TEXT = "RuntimeError: Ninja is required to load C++ extensions (pip install ninja to get it)"


# `env:MODE` (faults.ENV_MODES): real lines (tests/fixtures/environment/README.md names sources).
ENV_FAULT_TEXT = {
    "cache-perm": "PermissionError: [Errno 13] Permission denied: '/var/lib/sglang/.triton'",
    "cache-readonly": "OSError: [Errno 30] Read-only file system: '/var/lib/sglang/.cache/flashinfer'",
    "no-cudart": "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
    "no-nvrtc": "ImportError: libnvrtc.so.12: cannot open shared object file: No such file or directory",
    "no-cc": "RuntimeError: Failed to find C compiler. Please specify via CC environment variable.",
    "jit-build": "RuntimeError: Error building extension 'sgl_kernel_jit_norm'",
}


def _capture_failure(cfg: SimConfig, rank: int, mem: Memory, fault: Fault, phase: str) -> list[Step]:
    if fault.mode == "no-ninja":
        return _traceback(cfg, rank, NO_NINJA_TEXT, None)
    oom = fault.mode == "oom"
    err = _oom(cfg, rank, mem) if oom else CAPTURE_ERROR_TEXT
    exc = "torch.OutOfMemoryError" if oom else "RuntimeError"
    if phase in ("prefill", "draft-prefill"):
        if cfg.prefill_backend in ("piecewise", "tc_piecewise"):
            return [
                _log(LEGACY_PIECEWISE_FAIL_HINT.format(error=err)),
                *_traceback(cfg, rank, f"{exc}: {err}", None),
            ]
        short = exc.rsplit(".", 1)[-1]
        return [
            _log(f"{short}: {err}\n{cfg.spec.prefill_hint}"),
            *_traceback(cfg, rank, f"{exc}: {err}", None),
        ]
    if phase.startswith("draft") and not oom:
        return _traceback(cfg, rank, "ModuleNotFoundError: No module named 'deep_gemm'", None)
    wrapped = f"Exception: Capture cuda graph failed: {err}\n{cfg.spec.decode_hint}"
    return _traceback(cfg, rank, f"{exc}: {err}", wrapped)


def _kv_oom(cfg: SimConfig, mem: Memory) -> str:
    if cfg.spec.kv_oom_style == "value_error":
        need = max(0.001, round((mem.weights + mem.draft_weights + 1) / mem.total, 3))
        return (
            f"ValueError: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={cfg.mem_fraction_static}. Raise --mem-fraction-static above "
            f"{need} (minimum viable = 1 - available/pre = {need}). If using speculative decoding, "
            "draft weights are now counted."
        )
    return (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        f"Current value: mem_fraction_static={cfg.mem_fraction_static}"
    )


class _Phases:
    """Collects the steps of one rank, applying faults at the right moment."""

    def __init__(self, cfg: SimConfig, rank: int, faults: tuple[Fault, ...]) -> None:
        self.cfg, self.rank, self.faults = cfg, rank, faults
        self.steps: list[Step] = []
        self.first_draft: str | None = None  # `capture-fail:draft` hits the first draft graph
        self.stopped = False
        self.mem = memory_plan(cfg)
        self.avail = self.mem.start_avail
        self.layers = throughput.num_layers(cfg.model_gb)

    def fault(self, kind: str, stage: str | None = None, *, any_rank: bool = False) -> Fault | None:
        for f in self.faults:
            if f.kind == kind and f.stage == stage and (any_rank or f.rank == self.rank):
                return f
        return None

    def log(self, text: str) -> None:
        if not self.stopped:
            self.steps.append(_log(text))

    def add(self, *steps: Step) -> None:
        if not self.stopped:
            self.steps.extend(steps)

    def stop(self, *steps: Step) -> None:
        self.add(*steps)
        self.stopped = True

    def bar(self, items: list[str], seconds: float) -> None:
        if self.rank == 0:
            self.add(*_timed_bar(items, seconds))
        else:
            self.add(_sleep(seconds))


def _load_weights(p: _Phases, weights: float, seconds: float, klass: str, hang_crash: bool) -> None:
    cfg = p.cfg
    if cfg.spec.init_style == "parallel":
        p.log("Init parallel begin.")
        p.add(_sleep(0.05 * cfg.tp_size))
        p.log(f"Init parallel ends. elapsed={0.05 * cfg.tp_size:.2f} s")
        p.log("Memory baseline taken. mem usage=0.09 GB")
    else:
        p.log("Init torch distributed begin.")
        p.add(_sleep(0.05 * cfg.tp_size))
        p.log(f"Init torch distributed ends. elapsed={0.05 * cfg.tp_size:.2f} s, mem usage=0.09 GB")
    p.log(f"Load weight begin. avail mem={p.avail:.2f} GB")
    shards = max(1, math.ceil(weights * cfg.tp_size / 5))
    if hang_crash:
        if p.fault("hang", "load", any_rank=True):
            p.bar([""] * shards, seconds / 3)
            p.stop(Step("hang"))
        if p.fault("crash", "load"):
            p.add(_sleep(seconds / 3))
            p.stop(Step("die"))
    p.bar([cfg.spec.weight_progress] * shards, seconds)
    p.avail -= weights
    p.log(
        f"Load weight end. elapsed={seconds:.2f} s, type={klass}, avail mem={p.avail:.2f} GB, "
        f"mem usage={weights:.2f} GB."
    )


def _capture(  # noqa: PLR0917 - one call per graph kind, each naming all of these
    p: _Phases,
    owner: str,
    phase: str,
    fault_phase: str,
    header: str,
    bar_desc: list[str],
    seconds: float,
    mem_usage: float,
    end_extra: str = "",
    on_all_ranks: bool = True,
) -> None:
    """One graph capture: begin line, progress bar, end line; or the failure/hang/crash.

    Long because: its signature names the facts every graph kind differs by, one a line, and its
    body is one capture's outcomes in the order a fault decides them (this rank fails, another rank
    fails, hang, crash, success with its version's end line).
    """
    cfg = p.cfg
    printed = on_all_ranks or p.rank == 0
    legacy = cfg.spec.capture_style == "legacy"
    if printed:
        p.log(header)
    fail = p.fault("capture-fail", fault_phase)
    if fail is None and fault_phase.startswith("draft-") and not p.stopped:
        p.first_draft = p.first_draft or fault_phase
        fail = p.fault("capture-fail", "draft") if p.first_draft == fault_phase else None
    if fail is not None:
        p.bar(bar_desc[:1], seconds / 4)
        p.stop(*_capture_failure(cfg, p.rank, p.mem, fail, fault_phase))
        return
    if any(
        f.kind == "capture-fail"
        and f.rank != p.rank
        and (f.stage == fault_phase or (f.stage == "draft" and p.first_draft == fault_phase))
        for f in p.faults
    ):
        # another rank fails this capture; this one waits in its next collective until killed
        p.add(_sleep(seconds / 4))
        p.stop(Step("hang"))
        return
    if p.fault("hang", "capture", any_rank=True):
        p.bar(bar_desc[:1], seconds / 4)
        p.stop(Step("hang"))
        return
    if p.fault("crash", "capture"):
        p.add(_sleep(seconds / 3))
        p.stop(Step("die"))
        return
    p.bar(bar_desc, seconds)
    p.avail -= mem_usage
    if not printed:
        return
    if legacy:
        what = {
            "decode": "cuda graph",
            "verify": "cuda graph",
            "prefill": "piecewise CUDA graph",
            "draft-decode": "draft cuda graph",
            "draft-extend": "draft extend cuda graph",
        }[fault_phase]
        p.log(
            f"Capture {what} end. Time elapsed: {seconds:.2f} s. mem usage={mem_usage:.2f} GB. "
            f"avail mem={p.avail:.2f} GB."
        )
    else:
        p.log(
            f"Capture {owner} {phase} CUDA graph end. {end_extra}elapsed={seconds:.2f} s, "
            f"mem usage={mem_usage:.2f} GB, avail mem={p.avail:.2f} GB."
        )


def capture_timings(cfg: SimConfig) -> dict[str, float]:
    """Unscaled capture durations per phase (also the `Engine startup timings` line)."""
    layers = throughput.num_layers(cfg.model_gb)
    decode = 2.2 + 0.02 * layers
    return {
        "prefill": 30.0 + 0.65 * layers,
        "decode": decode,
        "target_verify": decode * 1.1,
        "draft_prefill": 1.5,
        "draft_decode": 3.5,
        "draft_extend": 1.2,
    }


def rank_script(cfg: SimConfig, rank: int, faults: tuple[Fault, ...]) -> list[Step]:
    """The whole startup of TP rank `rank`, ending in `ready` (or a failure).

    Long because: SGLang's scheduler init in its order (weights, draft weights, KV pools, prefill
    graph, decode or verify graph, draft graphs, the ready line), each phase a few steps or one
    helper call; the order is what the fixtures of real logs check.
    """
    p = _Phases(cfg, rank, faults)
    refused = refused_on_this_gpu(cfg)
    if refused is not None:
        p.stop(*_scheduler_init_traceback(refused))
        return p.steps
    mem = p.mem
    t = capture_timings(cfg)
    legacy = cfg.spec.capture_style == "legacy"
    _load_weights(p, mem.weights, 0.3 + mem.weights / 1.6, cfg.model_class, True)
    if cfg.has_draft_model:
        klass = "Qwen3_5ForCausalLMMTP" if cfg.hybrid else cfg.model_class
        _load_weights(p, mem.draft_weights, 0.1 + mem.draft_weights / 1.6, klass, False)
    p.add(_sleep(0.5))
    env = next((f for f in p.faults if f.kind == "env" and f.rank == rank), None)
    if env is not None and env.stage is not None:
        p.stop(*_traceback(cfg, rank, ENV_FAULT_TEXT[env.stage], None))
        return p.steps
    if p.fault("kv-oom", any_rank=True) or mem.kv <= 0.05:
        if rank == 0 or p.fault("kv-oom") is None:
            p.stop(*_traceback(cfg, rank, _kv_oom(cfg, mem), None))
        else:
            p.stop(Step("hang"))
        return p.steps
    kv_each = mem.kv / 2
    label = "Full KV Cache" if cfg.hybrid else "KV Cache"
    p.log(
        f"{label} is allocated. dtype: torch.bfloat16, #tokens: {mem.kv_tokens}, "
        f"K size: {kv_each:.2f} GB, V size: {kv_each:.2f} GB"
    )
    if cfg.hybrid:
        p.log(
            f"Mamba Cache is allocated. max_mamba_cache_size: {cfg.max_running_requests * 2}, "
            f"conv_state size: 0.41GB, ssm_state size: {0.02 * cfg.max_running_requests:.2f}GB "
        )
    p.avail -= mem.kv
    p.log(f"Memory pool end. avail mem={p.avail:.2f} GB")
    if cfg.max_running_reset:
        p.log(
            "Max running requests is reset to 48 for speculative decoding. You can override this "
            "by explicitly setting --max-running-requests."
        )
    prefill_on = cfg.prefill_backend != "disabled"
    eagle_skip = (prefill_on and cfg.spec.eagle_target_prefill_skip and cfg.prefill_backend != "breakable"
                  and cfg.spec_algorithm in EAGLE_FAMILY
                  and not cfg.server_args.get("enable_return_hidden_states"))
    prefill_desc = [
        f"{cfg.spec.prefill_progress} (num_tokens={n} avail_mem={p.avail:.2f} GB)"
        for n in reversed(prefill_num_tokens(cfg))
    ]
    if eagle_skip:
        p.log(EAGLE_TARGET_PREFILL_OFF)
    elif prefill_on:
        header = (
            f"Capture piecewise CUDA graph begin. avail mem={p.avail:.2f} GB"
            if legacy
            else f"Capture target prefill CUDA graph begin. backend={cfg.prefill_backend}, "
            f"num_tokens={prefill_num_tokens(cfg)}, avail mem={p.avail:.2f} GB"
        )
        _capture(p, "target", "prefill", "prefill", header, prefill_desc, t["prefill"], mem.prefill_graph)
    elif not legacy:
        p.log(f"Disable prefill CUDA graph because {cfg.prefill_disabled_reason}")
    bs = decode_batch_sizes(cfg)
    bs_desc = [f"Capturing batches (bs={b} avail_mem={p.avail:.2f} GB)" for b in reversed(bs)]
    if cfg.decode_graph:
        phase = "verify" if cfg.speculative else "decode"
        per_req = cfg.spec_draft_tokens if cfg.speculative else 1
        header = _batch_graph_header(p, legacy, "", f"target {phase}", per_req, bs)
        secs = t["target_verify"] if cfg.speculative else t["decode"]
        _capture(
            p,
            "target",
            phase,
            phase,
            header,
            bs_desc,
            secs,
            mem.decode_graph,
            end_extra="" if legacy else f"bs={bs}, ",
        )
        if cfg.has_draft_model:
            _draft_graphs(p, bs, prefill_on and cfg.prefill_backend == "breakable", legacy)
    if p.stopped:
        return p.steps
    if rank == 0:
        p.log(
            f"max_total_num_tokens={mem.kv_tokens}, chunked_prefill_size={cfg.chunked_prefill_size}, "
            f"max_prefill_tokens=16384, max_running_requests={cfg.max_running_requests}, "
            f"context_len={cfg.context_len}, available_gpu_mem={p.avail:.2f} GB"
        )
    p.add(Step("ready"))
    return p.steps


def _draft_graphs(p: _Phases, bs: list[int], draft_prefill: bool, legacy: bool) -> None:
    cfg = p.cfg
    t = capture_timings(cfg)
    if cfg.hybrid and not legacy:
        # Measured with real 0.5.17 on an H200 (tests/fixtures/sglang-0.5.17-h200-seed): the MTP
        # draft of a Qwen3.5/3.6 hybrid never captures a prefill graph; its prefill runner says why,
        # on the same spot whether the target's prefill graph is on (breakable) or off.
        reason = DRAFT_PREFILL_OFF_HYBRID if draft_prefill else cfg.prefill_disabled_reason
        p.log(f"Disable prefill CUDA graph because {reason}")
    elif draft_prefill and not legacy:
        desc = [
            f"{cfg.spec.prefill_progress} (num_tokens={n} avail_mem={p.avail:.2f} GB)"
            for n in reversed(PREFILL_NUM_TOKENS)
        ]
        _capture(
            p,
            "draft",
            "prefill",
            "draft-prefill",
            f"Capture draft prefill CUDA graph begin. backend=breakable, "
            f"num_tokens={prefill_num_tokens(cfg)}, avail mem={p.avail:.2f} GB",
            desc,
            t["draft_prefill"],
            0.13,
        )
    bs_desc = [f"Capturing batches (bs={b} avail_mem={p.avail:.2f} GB)" for b in reversed(bs)]
    phases = [("decode", "draft ", cfg.spec_topk)] if cfg.spec_steps > 1 else []
    for phase, legacy_name, per_req in [*phases, ("extend", "draft extend ", cfg.spec_draft_tokens)]:
        header = _batch_graph_header(p, legacy, legacy_name, f"draft {phase}", per_req, bs)
        _capture(p, "draft", phase, f"draft-{phase}", header, bs_desc, t[f"draft_{phase}"], 0.04,
                 on_all_ranks=False)


def _batch_graph_header(  # noqa: PLR0917 - the begin line's parts, each differing per graph
    p: _Phases, legacy: bool, legacy_name: str, name: str, per_req: int, bs: list[int]
) -> str:
    """The begin line of a graph captured per batch size (target decode or verify, draft decode
    or extend): before 0.5.14 one wording (`Capture draft cuda graph begin.`), after it the
    per-phase one naming backend, tokens per request and batch sizes."""
    if legacy:
        return (f"Capture {legacy_name}cuda graph begin. This can take up to several minutes. "
                f"avail mem={p.avail:.2f} GB")
    return (f"Capture {name} CUDA graph begin. backend={p.cfg.decode_backend}, "
            f"num_tokens_per_req={per_req}, bs={bs}, avail mem={p.avail:.2f} GB")
