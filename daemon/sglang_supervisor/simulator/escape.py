"""The `setsid-escape` fault's runaway: `python -m sglang_supervisor.simulator.escape`.

What a careless engine plugin or a daemonising helper does: setsid() (a session and process
group of its own, out of reach of a group kill), fork, the parent exits (the grandchild is
re-parented), and the grandchild keeps running, holding a TCP port and the engine's stdout.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time


def main() -> int:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)  # the parent dies: the runaway is an orphan now
    with open("/proc/self/comm", "w") as comm:  # as `ps` and the supervisor's warning show it
        comm.write("sim-escapee")
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", 0))
    held.listen()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write(f"[{stamp}] sim-escapee pid={os.getpid()} session={os.getsid(0)} "
                     f"listening on 127.0.0.1:{held.getsockname()[1]}\n")
    sys.stdout.flush()
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
