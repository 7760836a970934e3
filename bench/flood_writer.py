"""A fast-writing "engine": writes the lines of FILE to stdout at RATE lines/s for SECONDS.

Prints one JSON line to stderr: lines written, achieved rate and the longest single write (a
write that blocks means the reader is slowing the engine down). RATE 0 = as fast as possible.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    path, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    out = sys.stdout.fileno()
    n = 0
    longest = 0.0
    tick = 0.005  # write in 5 ms batches: like a chatty engine, not one syscall per line
    per_tick = max(1, int(rate * tick)) if rate > 0 else 2000
    start = time.monotonic()
    deadline = start + seconds
    i = 0
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        batch = b"".join(lines[(i + k) % len(lines)] for k in range(per_tick))
        i += per_tick
        t0 = time.monotonic()
        view = memoryview(batch)
        while view:
            view = view[os.write(out, view):]
        longest = max(longest, time.monotonic() - t0)
        n += per_tick
        if rate > 0:
            next_t = start + n / rate
            pause = next_t - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    elapsed = time.monotonic() - start
    sys.stderr.write(json.dumps({"lines": n, "seconds": elapsed, "rate": n / elapsed,
                                 "longest_write_s": longest}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
