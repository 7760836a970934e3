"""SGLang's log line format, uvicorn's, and tqdm-style `\\r` progress frames. Pure functions."""

from __future__ import annotations

import time
from collections.abc import Sequence

_BLOCKS = " ▏▎▍▌▋▊▉█"


def stamp(now: float, ms: bool) -> str:
    base = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    if ms:
        return f"{base}.{int((now % 1) * 1000):03d}"
    return base


def rank_prefix(tp_rank: int | None, tp_size: int, dp_rank: int | None = None) -> str:
    """` DP{n}` with data parallelism, ` TP{n}` only when tp>1 (SGLang's configure_scheduler_process)."""
    parts = ""
    if dp_rank is not None:
        parts += f" DP{dp_rank}"
    if tp_rank is not None and tp_size > 1:
        parts += f" TP{tp_rank}"
    return parts


def line(message: str, now: float, *, ms: bool, prefix: str = "") -> str:
    """`[YYYY-MM-DD HH:MM:SS{.mmm}{ prefix}] message` plus newline (no level name, like SGLang)."""
    return f"[{stamp(now, ms)}{prefix}] {message}\n"


def uvicorn_line(message: str, now: float, level: str = "INFO") -> str:
    """uvicorn under SGLang's log config: `[YYYY-MM-DD HH:MM:SS] INFO:     message` (never ms)."""
    return f"[{stamp(now, False)}] {(level + ':').ljust(9)} {message}\n"


def _fmt_interval(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _bar(n: int, total: int, width: int = 10) -> str:
    frac = n / total if total else 1.0
    eighths = int(frac * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full
    if full < width:
        text += (_BLOCKS[part] if part else " ") + " " * (width - full - 1)
    return text


def progress_frame(desc: str, n: int, total: int, elapsed: float) -> str:
    """One tqdm frame, e.g. `Capturing batches (bs=8 avail_mem=1.00 GB):  33%|███▎      | 2/6 [...]`."""
    pct = int(100 * n / total) if total else 100
    if n == 0 or elapsed <= 0:
        rate = "?it/s"
        eta = "?"
    else:
        per = elapsed / n
        rate = f"{per:5.2f}s/it" if per >= 1 else f"{1 / per:5.2f}it/s"
        eta = _fmt_interval(per * (total - n))
    head = f"{desc}: " if desc else ""
    return f"{head}{pct:3d}%|{_bar(n, total)}| {n}/{total} [{_fmt_interval(elapsed)}<{eta}, {rate}]"


def progress_frames(desc_per_item: Sequence[str], total_s: float) -> list[tuple[float, str]]:
    """(delay_before, text) frames of a bar redrawn in place, the last one ending the line.

    Each frame ends with `\r` (tqdm writes `\r` before a frame; ending with it instead keeps the
    same CR-separated segments while leaving the cursor at column 0, so a line another rank
    writes meanwhile stays a line of its own). Each item redraws with its own description, like
    SGLang's capture loops.
    """
    total = len(desc_per_item)
    step = total_s / max(total, 1)
    frames: list[tuple[float, str]] = [(0.0, progress_frame("", 0, total, 0) + "\r")]
    for i, desc in enumerate(desc_per_item):
        frames.append((step, progress_frame(desc, i, total, step * i) + "\r"))
    last = desc_per_item[-1] if desc_per_item else ""
    frames.append((0.0, progress_frame(last, total, total, total_s) + "\n"))
    return frames
