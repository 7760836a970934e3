"""Fault specs for the simulator: a small grammar, parsed by pure functions.

    SPEC  := KIND [":" ARG]... ["@" SECONDS] ["+" QUAL]...
    QUAL  := "rank=" N              (which TP rank fails; default 0)
           | "when=" FLAG["=" VALUE] (apply only if the command line has FLAG [with VALUE])
           | "unless=" FLAG["=" VALUE] (apply only if it has not)

Specs come from `--sim-fault SPEC` (repeatable) and `SGLANG_SIM_FAULTS` (separated by `,` or `;`).
`+` separates qualifiers so that a spec stays one shell word and one list item.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CAPTURE_PHASES = ("prefill", "decode", "verify", "draft", "draft-prefill", "draft-decode", "draft-extend")
CAPTURE_MODES = ("oom", "error", "no-ninja")
HANG_STAGES = ("load", "capture", "serving")
PORT_RACE_MODES = ("uvicorn", "precheck")
CRASH_STAGES = ("load", "capture")
# `env:MODE`: the host, not the profile, fails the start after weight load, before any capture
# (simulator/startup.py ENV_FAULT_TEXT holds each mode's real line).
ENV_MODES = ("cache-perm", "cache-readonly", "no-cudart", "no-nvrtc", "no-cc", "jit-build")
# HTTP misbehaviours (`http:ENDPOINT:MODE`): which routes, and what they answer instead.
HTTP_ENDPOINTS = ("generate", "health", "metrics", "server_info", "model_info", "load")
HTTP_MODES = ("hang", "slow", "trickle", "garbage", "deep", "huge", "nonfinite")

GRAMMAR_HELP = """\
Fault specs (--sim-fault SPEC, repeatable; env SGLANG_SIM_FAULTS="SPEC,SPEC;SPEC"):
  SPEC := KIND[:ARG...][@SECONDS][+rank=N][+when=--flag[=value]][+unless=--flag[=value]]
  capture-fail:PHASE[:oom|:error|:no-ninja]
                                   capture of PHASE fails (prefill, decode, verify, draft,
                                   draft-prefill, draft-decode, draft-extend; default oom);
                                   no-ninja: the JIT kernel build inside it finds no ninja
                                   (torch's `Ninja is required to load C++ extensions`)
  kv-oom                           the KV cache pool does not fit (after weight load)
  env:MODE                         after weight load, before any capture, the host fails the
                                   start: cache-perm / cache-readonly (a JIT cache directory not
                                   writable), no-cudart / no-nvrtc (a CUDA library missing), no-cc
                                   (triton finds no C compiler), jit-build (a kernel build fails)
  hang:load | hang:capture         output stops during weight load / capture, process stays
  hang:serving[@S]                 S s after ready the scheduler freezes (/health 503 after 20 s)
  crash:load | crash:capture       a rank is SIGKILLed during init (launcher exits 1)
  crash[@S]                        a rank is SIGKILLed S s after ready (launcher exits -9)
  watchdog[@S]                     from S s after ready a forward stalls: watchdog fires (-9)
  nccl-timeout[@S]                 S s after ready a collective times out on the rank (abort)
  degrade:FACTOR[@S]               from S s after ready tok/s x FACTOR (<1) or / FACTOR (>1)
  eager-fallback[@S]               from S s after ready decode runs without CUDA graphs
  ignore-sigterm                   SIGTERM is ignored (only SIGKILL stops it)
  slow-drain:S                     the SIGTERM drain takes S s more
  warmup-fail                      the warmup request fails after "Uvicorn running" (-9)
  http:ENDPOINT:MODE[@S]           from S s after ready ENDPOINT (generate, health, metrics,
                                   server_info, model_info, load) answers with MODE: hang (never),
                                   slow (after 120 s), trickle (200, a byte a second, endless),
                                   garbage (200, not its format), deep (JSON nested 100000 deep),
                                   huge (200, an endless body without a newline), nonfinite
                                   (NaN, Infinity, 1e999 in its numbers)
  health-fine-generate-hangs[@S]   alias of http:generate:hang: /health stays 200
  health-slow-under-load[:S]       while requests run, /health answers only after S s (default
                                   60) although decoding continues (SGLang issue #22511)
  port-race[:uvicorn|:precheck]    a port lost to a race. uvicorn (default): another listener takes
                                   the HTTP port just before uvicorn binds it: uvicorn's bind error,
                                   exit 3 (the listener goes with us). precheck: SGLang's check of
                                   its derived ports fails at launch (`Port is already in use.`,
                                   ValueError), exit 1
  setsid-escape                    a child calls setsid(), forks, and its grandchild keeps running
                                   outside the engine's session, holding a TCP port (logged)
  echo-hostile[@S]                 S s after ready, requests whose prompts and outputs quote
                                   failure/crash/capture/ready lines are echoed like
                                   --log-requests does (on stdout, in its
                                   --log-requests-level/-format)
  garbage-output[:N][@S]           from S s after ready (0: from the start), after the first N
                                   teacher-forced scorings (N fidelity samples; default 0),
                                   greedy outputs and log-probs are those of a broken model
  late-divergence[@S]              greedy outputs agree for their first 24 tokens, then differ;
                                   log-probs differ by rounding noise only (must pass fidelity)
  accept-collapse[@S]              speculative decoding accepts no draft token (accept length 1)
  SECONDS are simulated seconds (multiplied by SGLANG_SIM_TIME_SCALE); default 0.
  +rank=N picks the failing TP rank (default 0; ranks are global: with --nnodes the fault
  happens on the node that hosts rank N); +when=--flag[=value] applies the fault only
  when the command line has that flag (and value), e.g. to make one profile of a ladder fail;
  +unless=--flag[=value] only when it has not (a derived profile that sets the flag passes)."""


class FaultSpecError(ValueError):
    """A fault spec that does not parse; the message names the spec and the fix."""


@dataclass(frozen=True, slots=True)
class WhenFlag:
    flag: str
    value: str | None
    absent: bool = False  # `unless=`: the fault applies only without this flag (value)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # capture-fail, kv-oom, hang, crash, watchdog, nccl-timeout, degrade, ...
    stage: str | None = None  # capture phase / hang stage / crash stage
    mode: str | None = None  # capture-fail: "oom" or "error"
    at_s: float = 0.0  # simulated seconds after ready (serving faults)
    factor: float | None = None  # degrade
    seconds: float | None = None  # slow-drain
    rank: int = 0
    when: tuple[WhenFlag, ...] = ()
    after: int = 0  # garbage-output:N: healthy for the first N fidelity samples (scored texts)

    def applies_to(self, argv: Sequence[str]) -> bool:
        return all(_has_flag(argv, w) != w.absent for w in self.when)


_KINDS = (
    "capture-fail",
    "kv-oom",
    "env",
    "hang",
    "crash",
    "watchdog",
    "nccl-timeout",
    "degrade",
    "eager-fallback",
    "ignore-sigterm",
    "slow-drain",
    "warmup-fail",
    "port-race",
    "setsid-escape",
    "echo-hostile",
    "http",
    "health-fine-generate-hangs",
    "health-slow-under-load",
    "garbage-output",
    "late-divergence",
    "accept-collapse",
)
_TIMED = {"garbage-output", "late-divergence", "accept-collapse",
          "hang", "crash", "watchdog", "nccl-timeout", "degrade", "eager-fallback", "echo-hostile", "http",
          "health-fine-generate-hangs"}
_NUMBER = re.compile(r"^\d+(\.\d+)?$")


def _has_flag(argv: Sequence[str], want: WhenFlag) -> bool:
    for i, tok in enumerate(argv):
        if tok == want.flag:
            if want.value is None:
                return True
            if i + 1 < len(argv) and argv[i + 1] == want.value:
                return True
        elif tok.startswith(want.flag + "=") and (
            want.value is None or tok[len(want.flag) + 1 :] == want.value
        ):
            return True
    return False


def _seconds(spec: str, text: str) -> float:
    if not _NUMBER.match(text):
        raise FaultSpecError(f"fault {spec!r}: {text!r} after '@' is not a number of seconds (e.g. @30)")
    return float(text)


def _one_of(spec: str, what: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise FaultSpecError(f"fault {spec!r}: unknown {what} {value!r}; use one of {', '.join(allowed)}")
    return value


def parse_fault(spec: str) -> Fault:
    """Parse one SPEC (grammar in GRAMMAR_HELP). Raises FaultSpecError with the fix.

    Long because: the fault grammar (GRAMMAR_HELP) in one parser: the qualifiers are read once, then
    one branch per fault kind checks its arguments and builds the Fault, so the grammar and its
    error messages can be read next to each other.
    """
    text = spec.strip()
    if not text:
        raise FaultSpecError("empty fault spec; see `sglang-sim --help` for the grammar")
    head, *quals = text.split("+")
    rank = 0
    when: list[WhenFlag] = []
    for q in quals:
        key, sep, val = q.partition("=")
        if key == "rank" and sep and val.isdigit():
            rank = int(val)
        elif key in ("when", "unless") and sep and val.startswith("--"):
            flag, eq, fval = val.partition("=")
            when.append(WhenFlag(flag, fval if eq else None, absent=key == "unless"))
        else:
            raise FaultSpecError(f"fault {spec!r}: bad qualifier {q!r}; use +rank=N, "
                                 "+when=--flag[=value] or +unless=--flag[=value]")
    body, at_sep, at_text = head.partition("@")
    kind, *args = body.split(":")
    _one_of(spec, "fault kind", kind, _KINDS)
    at_s = _seconds(spec, at_text) if at_sep else 0.0
    if at_sep and kind not in _TIMED:
        raise FaultSpecError(f"fault {spec!r}: {kind} takes no '@SECONDS'")
    tw = tuple(when)

    def nargs(lo: int, hi: int, usage: str) -> None:
        if not lo <= len(args) <= hi:
            raise FaultSpecError(f"fault {spec!r}: expected {usage}")

    if kind == "capture-fail":
        nargs(1, 2, "capture-fail:PHASE[:oom|:error|:no-ninja]")
        phase = _one_of(spec, "capture phase", args[0], CAPTURE_PHASES)
        mode = _one_of(spec, "capture failure mode", args[1], CAPTURE_MODES) if len(args) > 1 else "oom"
        return Fault(kind, stage=phase, mode=mode, rank=rank, when=tw, at_s=at_s)
    if kind == "env":
        nargs(1, 1, "env:" + "|".join(ENV_MODES))
        return Fault(kind, stage=_one_of(spec, "environment failure", args[0], ENV_MODES), rank=rank,
                     when=tw, at_s=at_s)
    if kind == "hang":
        nargs(1, 1, "hang:load, hang:capture or hang:serving[@S]")
        stage = _one_of(spec, "hang stage", args[0], HANG_STAGES)
        if at_sep and stage != "serving":
            raise FaultSpecError(f"fault {spec!r}: only hang:serving takes '@SECONDS'")
        return Fault(kind, stage=stage, rank=rank, when=tw, at_s=at_s)
    if kind == "crash":
        nargs(0, 1, "crash:load, crash:capture or crash[@S]")
        crash_stage = _one_of(spec, "crash stage", args[0], CRASH_STAGES) if args else None
        if at_sep and crash_stage is not None:
            raise FaultSpecError(f"fault {spec!r}: crash:{crash_stage} takes no '@SECONDS' (use crash@S)")
        return Fault(kind, stage=crash_stage, rank=rank, when=tw, at_s=at_s)
    if kind == "degrade":
        nargs(1, 1, "degrade:FACTOR[@S], e.g. degrade:0.5@60")
        try:
            factor = float(args[0])
        except ValueError:
            raise FaultSpecError(f"fault {spec!r}: FACTOR {args[0]!r} is not a number") from None
        if factor <= 0 or factor == 1:
            raise FaultSpecError(f"fault {spec!r}: FACTOR must be > 0 and != 1 (0.5 halves, 2 halves too)")
        return Fault(kind, factor=factor, rank=rank, when=tw, at_s=at_s)
    if kind == "http":
        nargs(2, 2, "http:ENDPOINT:MODE[@S], e.g. http:metrics:huge")
        endpoint = _one_of(spec, "HTTP endpoint", args[0], HTTP_ENDPOINTS)
        mode = _one_of(spec, "HTTP misbehaviour", args[1], HTTP_MODES)
        return Fault(kind, stage=endpoint, mode=mode, rank=rank, when=tw, at_s=at_s)
    if kind == "health-fine-generate-hangs":
        nargs(0, 0, "health-fine-generate-hangs[@S]")
        return Fault("http", stage="generate", mode="hang", rank=rank, when=tw, at_s=at_s)
    if kind == "health-slow-under-load":
        nargs(0, 1, "health-slow-under-load[:SECONDS]")
        slow = _seconds(spec, args[0]) if args else 60.0
        return Fault(kind, seconds=slow, rank=rank, when=tw, at_s=at_s)
    if kind == "port-race":
        nargs(0, 1, "port-race[:uvicorn|:precheck]")
        mode = _one_of(spec, "port race", args[0], PORT_RACE_MODES) if args else "uvicorn"
        return Fault(kind, mode=mode, rank=rank, when=tw, at_s=at_s)
    if kind == "garbage-output":
        nargs(0, 1, "garbage-output[:N][@S] (N: healthy for the first N scored texts)")
        if args and not args[0].isdigit():
            raise FaultSpecError(f"fault {spec!r}: N {args[0]!r} is not a count")
        return Fault(kind, rank=rank, when=tw, at_s=at_s, after=int(args[0]) if args else 0)
    if kind == "slow-drain":
        nargs(1, 1, "slow-drain:SECONDS")
        return Fault(kind, seconds=_seconds(spec, args[0]), rank=rank, when=tw, at_s=at_s)
    nargs(0, 0, f"{kind} without ':' arguments")
    return Fault(kind, rank=rank, when=tw, at_s=at_s)


def split_env(value: str) -> list[str]:
    """`SGLANG_SIM_FAULTS` items, separated by `,` or `;` (blank items ignored)."""
    return [part.strip() for part in re.split(r"[,;]", value) if part.strip()]


def parse_faults(specs: Iterable[str]) -> tuple[Fault, ...]:
    return tuple(parse_fault(s) for s in specs)


def active(faults: Iterable[Fault], argv: Sequence[str]) -> tuple[Fault, ...]:
    """The faults whose `when=` bindings match this command line."""
    return tuple(f for f in faults if f.applies_to(argv))


def degrade_multiplier(factor: float) -> float:
    """`degrade:0.5` and `degrade:2` both halve the rate."""
    return factor if factor < 1 else 1.0 / factor
