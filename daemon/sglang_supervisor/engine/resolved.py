"""The CUDA graph sizes SGLang resolved for a start, read from its `server_args=` dump.

A profile that does not set the decode graph's max batch size (or the prefill graph's max token
count) runs with SGLang's own default, which depends on the release, the GPU's memory and the
model; SGLang prints the value it resolved, so derived profiles (core/derive.py) halve that
instead of guessing the rule. Three spellings, newest last, all recorded from real dumps:

- <= 0.5.13: `cuda_graph_max_bs=160` (resolved in `__post_init__`), `disable_cuda_graph=True`;
  the piecewise prefill graph's `piecewise_cuda_graph_max_tokens=4096`.
- 0.5.14 .. 0.5.22: the flags as given (`cuda_graph_max_bs_decode=None`) and the resolved record
  `cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend='full', max_bs=256, bs=[...],
  ...), prefill=PhaseConfig(backend='breakable', max_bs=8192, ...))`
  (tests/fixtures/sglang-0.5.17-h200-seed/tuned-without-sbo.engine.log).
- 0.5.23: a dict dump (`resolved_dict()`), nested records as dicts:
  `'cuda_graph_config': {'decode': {'backend': 'full', 'max_bs': 256, ...}, ...}`.
A phase whose backend is `disabled` (or None) has no graph: no size is reported for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_PHASE = {ph: re.compile(rf"""(?:\b{ph}=PhaseConfig\(|['"]{ph}['"]\s*:\s*\{{)(?P<body>[^(){{}}]*)""")
          for ph in ("decode", "prefill")}
_BACKEND = re.compile(r"""\bbackend['"]?\s*[=:]\s*['"]?(?P<v>\w+)""")
_MAX_BS = re.compile(r"""\bmax_bs['"]?\s*[=:]\s*(?P<v>\d+)""")
_OFF = ("disabled", "None", "none")
# Older dumps: the flat resolved fields, per phase (first set wins).
_FLAT = {"decode": ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"),
         "prefill": ("cuda_graph_max_bs_prefill", "piecewise_cuda_graph_max_tokens")}
_FLAT_OFF = {"decode": ("disable_cuda_graph", "disable_decode_cuda_graph"),
             "prefill": ("disable_piecewise_cuda_graph", "disable_prefill_cuda_graph")}


def resolved_graph_max(server_args: Mapping[str, str]) -> dict[str, int]:
    """{"decode": max batch size, "prefill": max tokens} of the graphs this start captures, as
    SGLang resolved them (core/logwatch.parse_server_args's dict of the dump); a phase that is
    off or not found is absent."""
    out: dict[str, int] = {}
    record = server_args.get("cuda_graph_config", "")
    for phase, pattern in _PHASE.items():
        m = pattern.search(record)
        if m is not None:
            backend = _BACKEND.search(m["body"])
            size = _MAX_BS.search(m["body"])
            if backend is not None and backend["v"] in _OFF:
                continue
            if size is not None:
                out[phase] = int(size["v"])
            continue
        if any(server_args.get(k) == "True" for k in _FLAT_OFF[phase]):
            continue
        value = next((server_args[k] for k in _FLAT[phase] if server_args.get(k, "").isdigit()), None)
        if value is not None:
            out[phase] = int(value)
    return out
