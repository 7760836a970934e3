"""The speculative flags of the Qwen3.6-27B seed (MTP as NEXTN: 3 steps, top-k 1, 4 draft
tokens), which the simulator's, the audit's and the integration tests start from.

`tests` is not a package: tests import this as `from seedargs import NEXTN_SPEC` (see conftest.py).
"""

from __future__ import annotations

NEXTN_SPEC = (
    "--speculative-algorithm",
    "NEXTN",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
)
