"""Output fidelity: is the engine still writing what this model wrote under the conservative profile?

A *sample* is what the engine answers to a fixed probe set: a few short natural prompts decoded
greedily for a few dozen tokens each (their output token ids), and one fixed reference text scored
teacher-forced (SGLang's `return_logprob` with `logprob_start_len=0`: the log-probability of each
of its tokens given the ones before). The *reference* is one sample taken under the most
conservative profile that reached READY (no CUDA graphs, no speculative decoding); every later
start is judged against it (`judge`).

The statistic, and why (docs/OPERATIONS.md "Output fidelity"):

- **Greedy prefix agreement over the first K tokens of each prompt.** A broken start (damaged
  weights, a wrong kernel, a broken draft path that corrupts the verify step) changes the argmax
  at once: the first tokens differ. A correct start on another kernel (CUDA graphs, another
  attention backend, another batch shape) computes the same function with different rounding:
  two logits that were nearly tied can swap after many tokens, and greedy decoding then diverges
  for good. That *late divergence* is expected and must pass, so only the first K tokens count.
- **Mean absolute log-prob difference over the teacher-forced reference text.** Teacher forcing
  feeds both runs the same tokens, so one early rounding difference cannot snowball: the mean
  absolute difference stays at the size of the numerical noise for a correct start and is large
  for a broken one. It sees damage the greedy prefixes can miss (a model that still picks the
  same top token but with a very different distribution), and it is the number to calibrate.
- **Speculative acceptance against the same weights' own value.** A draft path that breaks
  without corrupting the output (verification rejects every draft) shows as the accept length
  collapsing, never as wrong text. It is judged against the accept length this profile had when
  it last passed (the same weights), never against an absolute number.

Pure: the shell gathers samples over HTTP (shell/checks/fidelity.py) and stores the reference.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# The probe set. Changing a prompt, the token count or the reference text changes what a sample
# means: bump PROBE_SET_VERSION, and every stored reference is re-taken.
PROBE_SET_VERSION = "f1"
PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Here is a short story about a lighthouse keeper who",
    "To make a cup of tea, first",
)
PROMPT_TOKENS = 32  # greedy tokens per prompt
REFERENCE_TEXT = (
    "The river ran quietly past the old mill, and the children who lived in the village below "
    "had learned to tell the time of day by the sound of its wheel turning in the water."
)
# The cost of one sample in generated tokens (prefill of the prompts and the reference text aside):
# the figure docs/OPERATIONS.md turns into tokens per hour for `fidelity.interval_s`.
SAMPLE_GENERATED_TOKENS = len(PROMPTS) * PROMPT_TOKENS + 1
MAX_TEXT_SHOWN = 160  # characters of an expected/received text in logs, state and /status

Reason = Literal["ok", "prefix", "logprob", "tokens", "accept_collapse", "shape"]


@dataclass(frozen=True)
class PromptSample:
    prompt: str
    output_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Sample:
    prompts: tuple[PromptSample, ...]
    ref_ids: tuple[int, ...]  # the reference text's tokens, as the engine tokenised it
    ref_logprobs: tuple[float | None, ...]  # per token; the first has none (nothing before it)
    spec_accept_length: float | None = None


@dataclass(frozen=True)
class Tolerance:
    prefix_tokens: int = 16  # K: the first K greedy tokens of every prompt must agree
    max_logprob_diff: float = 0.25  # nats: the teacher-forced mean absolute difference allowed
    accept_collapse_ratio: float = 0.5  # accept length below this share of the same weights' own


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: Reason
    detail: str = ""
    prompt: str | None = None  # the prompt whose output disagreed (prefix), or None
    expected: str | None = None  # bounded, redacted
    received: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def logprob_diff(ref: Sequence[float | None], got: Sequence[float | None]) -> float | None:
    """Mean absolute difference over the positions both have a finite value for; None when none."""
    diffs = [abs(x - y) for x, y in zip(ref, got, strict=False)
             if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
    return sum(diffs) / len(diffs) if diffs else None


def shown(text: str, secrets: Sequence[str] = ()) -> str:
    """An engine's text as logs may show it: secrets replaced, control characters escaped, bounded."""
    for s in secrets:
        if s:
            text = text.replace(s, "[redacted]")
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= MAX_TEXT_SHOWN else out[:MAX_TEXT_SHOWN] + "…"


def statistics(ref: Sample, got: Sample) -> dict[str, Any]:
    """The numbers a verdict is made of (recorded for every check, so the tolerance can be
    calibrated from real runs): per-prompt common prefix, the smallest, the log-prob difference."""
    prefixes = [common_prefix(r.output_ids, g.output_ids)
                for r, g in zip(ref.prompts, got.prompts, strict=False)]
    return {
        "prefix_agreement": prefixes,
        "min_prefix": min(prefixes) if prefixes else 0,
        "prompt_tokens": [len(r.output_ids) for r in ref.prompts],
        "logprob_mean_abs_diff": _round(logprob_diff(ref.ref_logprobs, got.ref_logprobs)),
        "ref_tokens_equal": ref.ref_ids == got.ref_ids,
        "spec_accept_length": got.spec_accept_length,
    }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 5)


def judge(ref: Sample, got: Sample, tol: Tolerance, *, baseline_accept: float | None = None,
          secrets: Sequence[str] = ()) -> Verdict:
    """Whether `got` agrees with the reference `ref`. `baseline_accept`: this profile's accept
    length when it last passed on the same weights (None: not speculative, or never measured)."""
    stats = statistics(ref, got)
    if len(got.prompts) != len(ref.prompts) or any(
            r.prompt != g.prompt for r, g in zip(ref.prompts, got.prompts, strict=False)):
        return Verdict(False, "shape", "the sample's prompts are not the reference's", stats=stats)
    for r, g, n in zip(ref.prompts, got.prompts, stats["prefix_agreement"], strict=True):
        need = min(tol.prefix_tokens, len(r.output_ids))
        if n < need:
            return Verdict(False, "prefix",
                           f"greedy output diverged at token {n} of the first {need}",
                           prompt=r.prompt, expected=shown(r.text, secrets),
                           received=shown(g.text, secrets), stats=stats)
    if not stats["ref_tokens_equal"]:
        return Verdict(False, "tokens", "the reference text tokenised differently: another "
                       "tokenizer than the reference's", stats=stats)
    mad = stats["logprob_mean_abs_diff"]
    if mad is not None and mad > tol.max_logprob_diff:
        return Verdict(False, "logprob", f"teacher-forced log-probs differ by {mad:.4f} nats on "
                       f"average (tolerance {tol.max_logprob_diff:g})", stats=stats)
    collapsed = accept_collapsed(baseline_accept, got.spec_accept_length, tol.accept_collapse_ratio)
    if collapsed:
        return Verdict(False, "accept_collapse",
                       f"speculative accept length {got.spec_accept_length:.2f} against "
                       f"{baseline_accept:.2f} on the same weights: the draft path is broken",
                       stats=stats)
    return Verdict(True, "ok", stats=stats)


def accept_collapsed(baseline: float | None, now: float | None, ratio: float) -> bool:
    """An accept length fell to a fraction of the same weights' own (> 1: a draft was accepted).
    Relative to what was gained over 1.0 (1.0 means no draft token was ever accepted)."""
    if baseline is None or now is None or baseline <= 1.0:
        return False
    return (now - 1.0) < ratio * (baseline - 1.0)


def reference_key(model: str, model_files: Mapping[str, bytes], dtype: str) -> str:
    """One reference per model + tokenizer + dtype: the model path, the content of its config and
    tokenizer files (name -> bytes, as read), the dtype the command asks for, the probe set."""
    h = hashlib.sha256()
    for part in (PROBE_SET_VERSION, model, dtype):
        h.update(part.encode() + b"\0")
    for name in sorted(model_files):
        h.update(name.encode() + b"\0" + hashlib.sha256(model_files[name]).digest())
    return h.hexdigest()[:16]


def reference_profile(profiles: Sequence[str], configured: str | None) -> str:
    """The profile references are taken under: the configured one, else the ladder's last rung."""
    return configured if configured is not None else profiles[-1]


def tokens_per_hour(interval_s: float) -> float:
    """Generated tokens per hour of the periodic check (prefill aside)."""
    return SAMPLE_GENERATED_TOKENS * 3600.0 / interval_s if interval_s > 0 else 0.0


# -- (de)serialisation of the stored reference: untrusted on the way back ----------------------


def sample_to_json(s: Sample) -> dict[str, Any]:
    return {"prompts": [{"prompt": p.prompt, "output_ids": list(p.output_ids), "text": p.text}
                        for p in s.prompts],
            "ref_ids": list(s.ref_ids), "ref_logprobs": list(s.ref_logprobs),
            "spec_accept_length": s.spec_accept_length}


class SampleFormatError(ValueError):
    pass


def _ints(v: object, what: str, limit: int = 4096) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > limit or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 32 for x in v):
        raise SampleFormatError(f"{what}: not a list of token ids")
    return tuple(v)


def _floats(v: object, what: str, limit: int = 4096) -> tuple[float | None, ...]:
    if not isinstance(v, list) or len(v) > limit:
        raise SampleFormatError(f"{what}: not a list of numbers")
    out: list[float | None] = []
    for x in v:
        if x is None:
            out.append(None)
        elif isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and abs(x) < 1e6:
            out.append(float(x))
        else:
            raise SampleFormatError(f"{what}: not a list of numbers")
    return tuple(out)


def _text(v: object, what: str, limit: int = 65536) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise SampleFormatError(f"{what}: not a text")
    return v


def sample_from_json(raw: object) -> Sample:
    if not isinstance(raw, dict):
        raise SampleFormatError("sample: not an object")
    prompts = raw.get("prompts")
    if not isinstance(prompts, list) or len(prompts) > 64:
        raise SampleFormatError("sample.prompts: not a list")
    ps: list[PromptSample] = []
    for i, p in enumerate(prompts):
        if not isinstance(p, dict):
            raise SampleFormatError(f"sample.prompts[{i}]: not an object")
        ps.append(PromptSample(_text(p.get("prompt"), f"prompts[{i}].prompt"),
                               _ints(p.get("output_ids"), f"prompts[{i}].output_ids"),
                               _text(p.get("text"), f"prompts[{i}].text")))
    accept = raw.get("spec_accept_length")
    if accept is not None and not (isinstance(accept, int | float) and not isinstance(accept, bool)
                                   and math.isfinite(accept)):
        raise SampleFormatError("sample.spec_accept_length: not a number")
    return Sample(tuple(ps), _ints(raw.get("ref_ids"), "ref_ids"),
                  _floats(raw.get("ref_logprobs"), "ref_logprobs"),
                  None if accept is None else float(accept))
