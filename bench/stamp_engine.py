"""Engine wrapper for the benchmarks: runs the real engine command, relays its output unchanged to
the supervisor's pipe and records, in the file $BENCH_STAMPS, when things happened:

    ready <time_ns> <monotonic_ns>   as the chunk holding SGLang's ready line is written to the pipe
    out <time_ns>     as each chunk is relayed (the last one is "last engine output")
    exit <time_ns> <returncode>   when the engine process ended

Times are time.time_ns() (wall clock, the clock of the supervisor's JSON log timestamps) and
time.monotonic_ns() for latency against our own notify socket: "ready" lines carry both.
SIGTERM is forwarded to the engine (the supervisor signals the group leader, which is us).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

READY = b"The server is fired up and ready to roll"


def main() -> int:
    stamps = os.open(os.environ["BENCH_STAMPS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # SGLang logs (the ready line included) on stderr and writes request records on stdout; the
    # supervisor parses only stderr, so stderr is relayed and stamped, stdout inherited as is.
    child = subprocess.Popen(sys.argv[1:], stderr=subprocess.PIPE)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    out = sys.stderr.fileno()
    seen_ready = False
    assert child.stderr is not None
    src = child.stderr.fileno()
    tail = b""
    while True:
        try:
            data = os.read(src, 65536)
        except InterruptedError:
            continue
        if not data:
            break
        # Stamped just before the write: after it, the supervisor may run first on a busy machine.
        line = f"out {time.time_ns()}\n"
        if not seen_ready and READY in tail + data:
            seen_ready = True
            line = f"ready {time.time_ns()} {time.monotonic_ns()}\n" + line
        tail = data[-64:]
        view = memoryview(data)
        while view:
            view = view[os.write(out, view):]
        os.write(stamps, line.encode())
    rc = child.wait()
    os.write(stamps, f"exit {time.time_ns()} {rc}\n".encode())
    if rc < 0:  # die the way the engine died, so the supervisor classifies it the same
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
