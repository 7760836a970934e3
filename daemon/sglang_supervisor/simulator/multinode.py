"""Multi-node launch as SGLang does it: `--nnodes N --node-rank R --dist-init-addr HOST:PORT`.

- TP ranks are global: node R hosts ranks R*tp/N .. (R+1)*tp/N - 1 with SGLang's `TP{n}` prefixes
  (engine.py `_launch_scheduler_processes`: `tp_size_per_node * node_rank ...`).
- A real TCP rendezvous on the leader's dist-init port stands in for torch.distributed's TCPStore:
  the leader listens, every other node connects and says its rank; nobody proceeds until all N
  nodes joined, or `--dist-timeout` passed (then the store's DistStoreError, and the rank dies).
  The simulator does it in the launcher, before the ranks start; in SGLang the ranks do it during
  `init_distributed_environment`, so a missing node shows the same way: start-up blocks.
- The connections stay open while the engine runs: they are the group's collectives. A node whose
  rank died closes them; its peers' collectives then never complete (the leader's engine wedges,
  as NCCL waits until its 600 s timeout).
- Nodes other than 0 serve no API: `launch_dummy_health_check_server` answers 200 on `/health` and
  `/health_generate` whatever the ranks do.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

DEFAULT_DIST_TIMEOUT_S = 600.0  # simulated seconds when --dist-timeout is not given


class RendezvousError(RuntimeError):
    """The store timed out (torch.distributed.DistStoreError's text) or the address is bad."""


def local_ranks(tp_size: int, nnodes: int, node_rank: int) -> range:
    per = tp_size // nnodes
    return range(per * node_rank, per * (node_rank + 1))


def parse_dist_init_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RendezvousError(f"--dist-init-addr {addr!r}: expected HOST:PORT, e.g. 10.0.0.1:5000")
    return host.strip("[]"), int(port)


def _timeout_text(timeout_s: float, joined: int, nnodes: int) -> str:
    return (f"torch.distributed.DistStoreError: Timed out after {int(timeout_s) + 1} seconds waiting "
            f"for clients. {joined}/{nnodes} clients joined.")


def leader_rendezvous(host: str, port: int, nnodes: int, timeout_s: float) -> list[socket.socket]:
    """Listen on the dist-init port until nnodes-1 peers joined; then tell each to go."""
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((host, port))
    except OSError as exc:
        srv.close()
        raise RendezvousError(
            f"torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            f"local network address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, "
            f"message: {exc.strerror or exc}") from None
    srv.listen(16)
    peers: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(peers) < nnodes - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                for s in peers.values():
                    s.close()
                raise RendezvousError(_timeout_text(timeout_s, len(peers) + 1, nnodes))
            ready, _, _ = select.select([srv], [], [], min(left, 1.0))
            if not ready:
                continue
            conn, _ = srv.accept()
            conn.settimeout(5.0)
            try:
                hello = conn.recv(64).decode("ascii", "replace").split()
            except OSError:
                conn.close()
                continue
            if len(hello) != 2 or hello[0] != "node" or not hello[1].isdigit():
                conn.close()  # not one of ours: a port scanner, a stale client
                continue
            old = peers.pop(int(hello[1]), None)
            if old is not None:
                old.close()
            peers[int(hello[1])] = conn
        for conn in peers.values():
            conn.sendall(b"go\n")
            conn.settimeout(None)
        return list(peers.values())
    finally:
        srv.close()


def worker_rendezvous(host: str, port: int, node_rank: int, timeout_s: float) -> socket.socket:
    """Connect to the leader's store (retrying while it is not up yet), wait for everyone."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RendezvousError(
                f"torch.distributed.DistNetworkError: The client socket has timed out after "
                f"{int(timeout_s)}000ms while trying to connect to ({host}, {port}).")
        try:
            conn = socket.create_connection((host, port), timeout=min(left, 5.0))
        except OSError:
            time.sleep(min(0.2, max(left, 0.0)))
            continue
        try:
            conn.sendall(f"node {node_rank}\n".encode())
            conn.settimeout(max(0.1, left))
            data = conn.recv(16)
        except OSError:
            conn.close()
            continue
        if data.startswith(b"go"):
            conn.settimeout(None)
            return conn
        conn.close()  # the leader restarted and dropped us: try again
        time.sleep(0.2)


def watch_peers(socks: list[socket.socket], on_lost: Callable[[], object]) -> threading.Thread:
    """Call on_lost (once, from a thread) when any peer connection closes: a collective broke."""

    def run() -> None:
        live = list(socks)
        while live:
            try:
                ready, _, _ = select.select(live, [], [], 1.0)
            except (OSError, ValueError):
                break
            for s in ready:
                try:
                    data = s.recv(64)
                except OSError:
                    data = b""
                if not data:
                    on_lost()
                    return

    t = threading.Thread(target=run, name="sim-collectives", daemon=True)
    t.start()
    return t


def dummy_health_app() -> Starlette:
    """SGLang's launch_dummy_health_check_server: 200 on /health and /health_generate, always."""

    async def ok(_: Request) -> Response:
        return Response(status_code=200)

    return Starlette(routes=[Route("/health", ok), Route("/health_generate", ok), Route("/ping", ok)])
