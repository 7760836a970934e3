"""Derived profiles: the smallest change to a failed profile that addresses its failure (issue 25).

A hand-written rung gives up a whole optimisation; when SGLang names one flag (`flag_refused`) or
one size is too large (a decode graph capture OOM), the same profile minus that flag, or with half
the decode graph's largest batch, keeps everything else. `derive` is the one rule table:

| failure | change | name |
|---|---|---|
| `flag_refused` naming `--X`, X set by the profile | drop X | `<base>-no-<short X>` (`tuned-no-sbo`) |
| `capture_oom`, the decode graph's max bs known | halve it, floor `MIN_GRAPH_BS` | `<base>-graph-bs-<n>` |
| `prefill_graph_failed` (OOM), max tokens known | halve, floor 256 | `<base>-prefill-tokens-<n>` |
| `kv_cache_oom`, `mem-fraction-static` set | + `MEM_STEP`, at most `MAX_MEM_FRACTION` | `<base>-mem-<f>` |

"Known": the profile sets it, else SGLang's resolved value from its server_args dump
(engine/resolved.py; `resolved_max_bs`, `resolved_prefill_max`). A profile that lists the graph's
sizes itself (`cuda-graph-bs`, `-decode`, `-prefill`, `piecewise-cuda-graph-tokens`) derives
nothing for that graph: SGLang captures the list it is given, whatever the max says.

Bounded: `steps` changes per written rung (a derived profile of a derived profile counts one more
step); anything else, or a rule that cannot apply, derives nothing and the ladder decides. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sglang_supervisor.core.events import FailureClass

ArgScalar = str | int | float | bool | None

# Short names for the flags SGLang is known to refuse, so derived names stay readable.
SHORT_FLAG_NAMES: Mapping[str, str] = {
    "enable-single-batch-overlap": "sbo",
    "enable-two-batch-overlap": "tbo",
}
# The spellings of the decode graph's largest batch size, newest first (0.5.14+ per phase; the
# older name is a deprecated alias until 0.5.20, engine/migrate renames it either way).
MAX_BS_FLAGS = ("cuda-graph-max-bs-decode", "cuda-graph-max-bs")
MIN_GRAPH_BS = 8  # below this the decode graph covers too few batch sizes to be worth keeping
# The prefill graph's largest token count: 0.5.14+ per phase, the piecewise name before (migrate
# renames it either way); below the floor the graph covers too little of a prefill to pay.
PREFILL_MAX_FLAGS = ("cuda-graph-max-bs-prefill", "piecewise-cuda-graph-max-tokens")
MIN_PREFILL_TOKENS = 256
DECODE_LIST_FLAGS = ("cuda-graph-bs-decode", "cuda-graph-bs")
PREFILL_LIST_FLAGS = ("cuda-graph-bs-prefill", "piecewise-cuda-graph-tokens")
MEM_FLAG = "mem-fraction-static"
MEM_STEP = 0.03
MAX_MEM_FRACTION = 0.95
NAME_LIMIT = 63  # config.PROFILE_NAME


@dataclass(frozen=True)
class Derivation:
    """A profile derived from `base` (a written rung): its overlay on `base` and why it exists."""

    name: str
    base: str
    remove: tuple[str, ...] = ()  # flags (no leading --) dropped from base
    args: Mapping[str, ArgScalar] = field(default_factory=dict)  # flags set on top of base
    steps: int = 1  # changes from base so far
    change: str = ""  # what this step changed, for the journal and /status
    asked_by: str = ""  # the failure line that asked for it

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "base": self.base, "remove": list(self.remove),
                "args": dict(self.args), "steps": self.steps, "change": self.change,
                "asked_by": self.asked_by}


def _name(base: str, suffix: str) -> str:
    return f"{base[:NAME_LIMIT - len(suffix) - 1]}-{suffix}"


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _as_float(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _halved(args: Mapping[str, object], flags: tuple[str, ...], lists: tuple[str, ...], *,
            resolved: int | None, floor: int, unset: str) -> tuple[str, int, int] | None:
    """(flag, current, half) for a graph's largest size: the flag the profile sets (first of
    `flags`), else `unset` at SGLang's resolved value; None when unknown, when the profile lists
    the sizes itself, or when half would go below `floor`."""
    if any(args.get(k) not in (None, False) for k in lists):
        return None
    key = next((k for k in flags if args.get(k) is not None), unset)
    current = _as_int(args.get(key)) if args.get(key) is not None else resolved
    if current is None or current // 2 < floor:
        return None
    return key, current, current // 2


def derive(failure: FailureClass, profile: str, args: Mapping[str, object], *,
           message: str, refused_flag: str | None = None, resolved_max_bs: int | None = None,
           resolved_prefill_max: int | None = None, oom: bool = False,
           parent: Derivation | None = None, steps: int = 2) -> Derivation | None:
    """The derived profile to try after `profile` failed with `failure`, or None.

    `args`: the profile's effective flags (config.effective_overlay, names without --).
    `resolved_max_bs` / `resolved_prefill_max`: the decode graph's max batch size / the prefill
    graph's max tokens SGLang resolved (engine/resolved.py). `oom`: a failure line of the attempt
    said out of memory. `parent`: `profile`'s own derivation when it is derived. `steps`: the
    most changes from the written rung (0: derivation off)."""
    base = parent.base if parent is not None else profile
    done = parent.steps if parent is not None else 0
    if done >= steps:
        return None
    removed = parent.remove if parent is not None else ()
    changed: dict[str, ArgScalar] = dict(parent.args) if parent is not None else {}
    stem = parent.name if parent is not None else base
    line = message[:300]

    def step(suffix: str, change: str, *, remove: tuple[str, ...] = (),
             set_args: Mapping[str, ArgScalar] | None = None) -> Derivation:
        # A second halving renames the first (tuned-graph-bs-16 -> tuned-graph-bs-8).
        kind = re.escape(suffix.rsplit("-", 1)[0])
        trimmed = re.sub(rf"-{kind}-[\d.]+$", "", stem) if set_args else stem
        return Derivation(name=_name(trimmed or stem, suffix), base=base, remove=(*removed, *remove),
                          args={**changed, **(set_args or {})}, steps=done + 1, change=change,
                          asked_by=line)

    if failure is FailureClass.FLAG_REFUSED and refused_flag is not None:
        flag = refused_flag.removeprefix("--")
        if args.get(flag) in (None, False):
            return None  # not the profile's own flag: dropping nothing would fail the same way
        short = SHORT_FLAG_NAMES.get(flag, flag.removeprefix("enable-"))
        return step(f"no-{short}", f"drop --{flag}", remove=(flag,))
    if failure is FailureClass.CAPTURE_OOM:
        # Unset: the newest spelling (engine/migrate renames it for releases before 0.5.14).
        half_bs = _halved(args, MAX_BS_FLAGS, DECODE_LIST_FLAGS, resolved=resolved_max_bs,
                          floor=MIN_GRAPH_BS, unset=MAX_BS_FLAGS[0])
        if half_bs is None:
            return None
        key, current, half = half_bs
        return step(f"graph-bs-{half}", f"--{key} {current} -> {half}", set_args={key: half})
    if failure is FailureClass.PREFILL_GRAPH_FAILED and oom:
        half_tokens = _halved(args, PREFILL_MAX_FLAGS, PREFILL_LIST_FLAGS,
                              resolved=resolved_prefill_max, floor=MIN_PREFILL_TOKENS,
                              unset=PREFILL_MAX_FLAGS[0])
        if half_tokens is None:
            return None
        key, current, half = half_tokens
        return step(f"prefill-tokens-{half}", f"--{key} {current} -> {half}", set_args={key: half})
    if failure is FailureClass.KV_CACHE_OOM:
        current_f = _as_float(args.get(MEM_FLAG))
        if current_f is None or current_f >= MAX_MEM_FRACTION:
            return None
        raised = round(min(current_f + MEM_STEP, MAX_MEM_FRACTION), 2)
        return step(f"mem-{raised:g}", f"--{MEM_FLAG} {current_f:g} -> {raised:g}",
                    set_args={MEM_FLAG: raised})
    return None
