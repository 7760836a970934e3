"""An ASGI app served inside the supervisor's event loop (a uvicorn.Server as a task) on a socket
bound here: the metrics endpoint (shell/telemetry/metrics.py) and the multi-node group link
(shell/links/grouplink.py). uvicorn's own signal handlers stay off: the supervisor handles its own
signals. Each caller words its own errors (which setting to change); the mechanics are these."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn would replace SIGTERM/SIGINT handlers; the supervisor handles its own signals.
        yield


def listening_socket(host: str, port: int, backlog: int, *, nodelay: bool = False) -> socket.socket:
    """A non-blocking TCP socket listening on host:port (SO_REUSEADDR; IPv6 when the host has a
    ':'). An OSError (port taken, no such address) leaves no socket open."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if nodelay:
            # Accepted sockets inherit it on Linux: no Nagle delay on small streamed writes.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class InLoopServer:
    """One app on one listening socket, served as a task of the running loop; `stop` asks it to
    exit, gives it `stop_wait_s`, then forces it (and closes the socket either way)."""

    def __init__(self, name: str, *, graceful_shutdown_s: int, stop_wait_s: float) -> None:
        self.name = name
        self._graceful_s = graceful_shutdown_s
        self._stop_wait_s = stop_wait_s
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None

    async def start(self, app: Any, sock: socket.socket,
                    failed: Callable[[BaseException | None], Exception]) -> None:
        """Serve `app` on `sock` (owned from here on); returns once it serves. If the server ends
        before it started, raises `failed(its exception)`."""
        self._sock = sock
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=self._graceful_s)
        self._server = _QuietServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=self.name)
        while not self._server.started:
            if self._task.done():
                raise failed(self._task.exception())
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self._stop_wait_s)
        except Exception:  # the wait timed out or the server task failed: force it
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._sock is not None:
            self._sock.close()
        self._server = self._task = self._sock = None
