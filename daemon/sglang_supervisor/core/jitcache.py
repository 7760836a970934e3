"""Where the engine's kernel caches live (pure): one directory per SGLang release, torch and GPU
under the unit's CacheDirectory, every cache variable the engine's libraries read pointed into it
unless the operator set that variable, and which old key directories go to keep the total bounded.

Why: under the shipped unit (PrivateTmp=yes, ProtectHome=yes) every cache a library keeps in /tmp
or in ~ is gone at the next start, so each `systemctl restart` and each fallback paid the JIT again
(an H200 with real 0.5.17: 126 s to READY cold, 79 s of it compiling the prefill graph's kernels).

The variables, and where each library reads it (checked in the sources, December 2026):

- `TRITON_CACHE_DIR`: triton `runtime/cache.py` / `knobs.py` `cache.dir`; default
  `~/.triton/cache` (lost: no home under ProtectHome).
- `TORCHINDUCTOR_CACHE_DIR`: torch `_inductor/runtime/cache_dir_utils.py` `cache_dir()`; default
  `tempfile.gettempdir()/torchinductor_$USER`, i.e. PrivateTmp's /tmp: lost at every restart. The
  FX-graph and AOT-autograd caches (`TORCHINDUCTOR_FX_GRAPH_CACHE`, on by default since torch 2.4)
  and the Triton kernels inductor writes live below it. SGLang's piecewise prefill graphs compile
  through it.
- `TVM_FFI_CACHE_DIR`: apache/tvm-ffi `python/tvm_ffi/cpp/extension.py:733` (`load_inline`, which
  SGLang's `jit_kernel/utils.py` `load_jit` calls for every JIT kernel) and
  `python/tvm_ffi/_optional_torch_c_dlpack.py:133` (the torch DLPack bridge built at import);
  default `~/.cache/tvm-ffi`.
- `FLASHINFER_WORKSPACE_BASE`: flashinfer `flashinfer/jit/env.py:58-62`; the JIT ops go to
  `$BASE/.cache/flashinfer/<flashinfer version>/<archs>/cached_ops`; default `$HOME`.
- `SGLANG_CACHE_DIR`: sglang `python/sglang/srt/environ.py` (`~/.cache/sglang`); newer releases
  resolve `SGLANG_DG_CACHE_DIR` (deep_gemm), `SGLANG_JIT_CACHE_DIR` (`~/.cache/sglang/jit`) and
  `SGLANG_CUTE_AOT_CACHE_DIR` under it.
- `SGLANG_DG_CACHE_DIR`: environ.py of the 0.5 releases, default `~/.cache/deep_gemm`; SGLang
  copies it into deep_gemm's own `DG_JIT_CACHE_DIR` (`compile_utils.py`), which deep_gemm also
  reads at its import (default `~/.deep_gemm`): both point at one directory.
- `SGLANG_JIT_CACHE_DIR`: the newer JIT-kernel loader (`sglang/kernels/jit/...`): explicit, since
  0.5.17's layout has no `SGLANG_CACHE_DIR` parent for it.
- `TORCH_EXTENSIONS_DIR`: torch `utils/cpp_extension.py` (`load`, `load_inline`); default
  `$XDG_CACHE_HOME/torch_extensions`.
- `CUDA_CACHE_PATH`: the CUDA driver's PTX JIT cache; default `~/.nv/ComputeCache`; bounded by
  `CUDA_CACHE_MAXSIZE` (the driver's default 1 GiB on servers; its maximum 4 GiB is what we set).

`HF_HOME` (model downloads) stays where the unit puts it, outside the key directories: weights do
not depend on the GPU or the release, and a pruned key must never cost a download. `XDG_CACHE_HOME`
stays the unit's catch-all for whatever else uses ~/.cache.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# $CACHE_DIRECTORY/<ENGINE_CACHE_SUBDIR>/<key>/<cache>: only this folder is ever pruned.
ENGINE_CACHE_SUBDIR = "engine-cache"
# Every key directory's name starts so; pruning looks at nothing else.
KEY_PREFIX = "sglang-"
# Touched at every launch that uses a key: the least recently used key goes first.
STAMP_NAME = ".last-used"
KEY_MAX_LEN = 160

# (variable, the key directory's subfolder it gets)
CACHE_VARS: tuple[tuple[str, str], ...] = (
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("TVM_FFI_CACHE_DIR", "tvm-ffi"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("SGLANG_CACHE_DIR", "sglang"),
    ("SGLANG_DG_CACHE_DIR", "deep_gemm"),
    ("DG_JIT_CACHE_DIR", "deep_gemm"),
    ("SGLANG_JIT_CACHE_DIR", "sglang-jit"),
    ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
    ("CUDA_CACHE_PATH", "nvidia-compute"),
)
# Not paths: set when the operator did not.
CACHE_SETTINGS: tuple[tuple[str, str], ...] = (
    ("CUDA_CACHE_MAXSIZE", str(4 << 30)),  # the driver's maximum (its default is 1 GiB)
)
CACHE_VAR_NAMES: tuple[str, ...] = tuple(v for v, _ in CACHE_VARS) + tuple(v for v, _ in CACHE_SETTINGS)

_UNSAFE = re.compile(r"[^a-z0-9.+]+")
_DASH_RUN = re.compile(r"[-.]*-[-.]*")
_DOTS = re.compile(r"\.{2,}")
_KEY_NAME = re.compile(r"sglang-[a-z0-9.+_-]+\Z")


def _part(text: str) -> str:
    """One safe name part: a-z, 0-9, `.`, `+`, `-`; never `..` (nor a run of `-` and `.`)."""
    part = _UNSAFE.sub("-", text.strip().lower())
    part = _DOTS.sub(".", _DASH_RUN.sub("-", part))
    return part.strip("-.") or "unknown"


def cache_key(sglang_version: str, gpus: Iterable[tuple[str, str | None]],
              torch_version: str | None = None) -> str:
    """The key directory's name: `sglang-0.5.17_torch-2.9.1_nvidia-h200-sm90`. Another release,
    torch or GPU model (name and compute capability) gets another directory. `gpus` are the
    engine's GPUs as (name, compute capability); several models are joined with `+`."""
    seen: list[str] = []
    for name, cc in gpus:
        part = _part(name) + (f"-sm{cc.replace('.', '')}" if cc else "")
        if part not in seen:
            seen.append(part)
    gpu = "+".join(sorted(seen)) or "gpu-unknown"
    parts = [KEY_PREFIX + _part(sglang_version)]
    if torch_version:
        parts.append("torch-" + _part(torch_version))
    parts.append(gpu)
    return "_".join(parts)[:KEY_MAX_LEN]


def is_key_name(name: str) -> bool:
    """A directory name `cache_key` could have made (pruning considers nothing else)."""
    return len(name) <= KEY_MAX_LEN and _KEY_NAME.match(name) is not None


def cache_env(key_dir: str, given: Mapping[str, str]) -> dict[str, str]:
    """The variables to add for the engine: each cache under `key_dir`, except those `given`
    already names (the operator's unit, drop-in or the config's engine/profile env: theirs win)."""
    out: dict[str, str] = {}
    for var, sub in CACHE_VARS:
        if var not in given:
            out[var] = f"{key_dir.rstrip('/')}/{sub}"
    for var, value in CACHE_SETTINGS:
        if var not in given:
            out[var] = value
    return out


@dataclass(frozen=True, slots=True)
class KeyDir:
    name: str
    size_bytes: int
    last_used: float  # seconds (the stamp's mtime; the directory's when there is no stamp)


@dataclass(frozen=True, slots=True)
class PrunePlan:
    remove: tuple[str, ...]     # key directory names, least recently used first
    total_bytes: int            # every key directory before pruning
    kept_bytes: int             # after
    over_with_current: bool     # the key in use alone is over the limit (kept: it is in use)


def choose_prune(dirs: Sequence[KeyDir], current: str, max_bytes: int | None) -> PrunePlan:
    """Which key directories to delete so that all of them together fit `max_bytes`: the least
    recently used first, never `current` (the one this launch uses). None: no limit."""
    total = sum(d.size_bytes for d in dirs)
    if max_bytes is None or total <= max_bytes:
        return PrunePlan((), total, total, False)
    remove: list[str] = []
    kept = total
    for d in sorted(dirs, key=lambda d: (d.last_used, d.name)):
        if kept <= max_bytes:
            break
        if d.name == current:
            continue
        remove.append(d.name)
        kept -= d.size_bytes
    return PrunePlan(tuple(remove), total, kept, kept > max_bytes)
