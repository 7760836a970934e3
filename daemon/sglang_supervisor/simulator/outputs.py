"""What the simulated model writes: greedy output ids that depend on the prompt (deterministic, as
a real model's greedy decoding), SGLang's teacher-forced `input_token_logprobs`, and the output
faults (`garbage-output`, `late-divergence`) that the supervisor's fidelity check must tell apart.
"""

from __future__ import annotations

import hashlib

VOCAB = 1000
# late-divergence: the first tokens agree with the healthy model, the rest do not (a correct
# kernel whose rounding swapped two nearly tied logits after many tokens).
LATE_DIVERGENCE_AT = 24
GARBAGE = "garbage-output"
LATE = "late-divergence"
OUTPUT_FAULTS = (GARBAGE, LATE, "accept-collapse")


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\0".join(map(str, parts)).encode()).digest()[:8], "big")


def output_ids(prompt: str, n: int, fault: str | None = None) -> list[int]:
    """The greedy continuation of `prompt`, `n` tokens long."""
    out = []
    for i in range(n):
        salt = "broken" if fault == GARBAGE or (fault == LATE and i >= LATE_DIVERGENCE_AT) else "model"
        out.append(_h(salt, prompt, i) % VOCAB)
    return out


def text_of(ids: list[int], words: tuple[str, ...]) -> str:
    return "".join(words[i % len(words)] for i in ids)


def input_logprobs(text: str, fault: str | None = None) -> list[list[object]]:
    """SGLang's `meta_info.input_token_logprobs` for `text` with logprob_start_len=0:
    [logprob, token_id, null] per token, the first without a logprob."""
    rows: list[list[object]] = []
    words = text.split()
    for i, w in enumerate(words):
        tid = _h("tok", w) % VOCAB
        lp = -(_h("lp", i, w) % 500) / 100.0
        if fault == GARBAGE:
            lp -= 3.0 + (_h("g", i) % 100) / 50.0
        elif fault == LATE:
            lp += 0.002 * ((_h("n", i) % 3) - 1)  # rounding noise only
        rows.append([None if i == 0 else round(lp, 6), tid, None])
    return rows
