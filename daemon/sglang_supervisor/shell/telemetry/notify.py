"""sd_notify adapter: tells systemd (Type=notify / notify-reload) what the supervisor is doing.

A thin shell over the `sdnotify` library. Without NOTIFY_SOCKET (run by hand, in tests) every call
is a no-op. A send never raises: systemd being restarted or the socket vanishing must not take the
supervisor down, so a failure is logged once and the next call tries a fresh connection.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import sdnotify
import structlog

log = structlog.get_logger("sglang_supervisor.shell.telemetry.notify")

# A blocked notify socket (systemd busy) must not freeze the main loop for long.
_SEND_TIMEOUT_S = 1.0


def _one_line(text: str) -> str:
    # A newline inside STATUS= would start a new assignment (e.g. a forged READY=1).
    return " ".join(text.split("\n")).replace("\r", " ")


def _as_sdnotify_str(state: str) -> str:
    # sdnotify encodes with latin-1 (and fails on anything else); systemd expects UTF-8. Handing it
    # the UTF-8 bytes spelled as latin-1 characters makes it send exactly the UTF-8 bytes.
    return state.encode("utf-8", "replace").decode("latin-1")


class Notifier:
    """sd_notify messages. Construct once per process; cheap no-op without NOTIFY_SOCKET."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = env.get("NOTIFY_SOCKET") or None
        self._watchdog_usec = _watchdog_usec(env)
        self._conn: sdnotify.SystemdNotifier | None = None
        self._failed = False  # a failure was logged; log again only after a success

    @property
    def enabled(self) -> bool:
        return self._address is not None

    # -- the messages --------------------------------------------------------------------------
    def ready(self, status: str | None = None) -> bool:
        return self._send("READY=1", status)

    def status(self, text: str) -> bool:
        return self._send(None, text)

    def watchdog(self) -> bool:
        return self._send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        """Push the current start/stop/reload deadline `seconds` from now (must be re-sent in time)."""
        usec = max(1, int(seconds * 1_000_000))
        return self._send(f"EXTEND_TIMEOUT_USEC={usec}")

    def stopping(self, status: str | None = None) -> bool:
        return self._send("STOPPING=1", status)

    def reloading(self, status: str | None = None) -> bool:
        # Type=notify-reload (systemd >= 253) wants MONOTONIC_USEC with RELOADING=1 to tell this
        # reload from an older one; older systemd ignores the extra field.
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self._send(f"RELOADING=1\nMONOTONIC_USEC={now_usec}", status)

    def mainpid(self, pid: int) -> bool:
        return self._send(f"MAINPID={pid}")

    def errno(self, code: int) -> bool:
        return self._send(f"ERRNO={code}")

    # -- watchdog timing -----------------------------------------------------------------------
    @property
    def watchdog_usec(self) -> int | None:
        """WatchdogSec= as systemd exported it, when it is meant for this process."""
        return self._watchdog_usec

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half the watchdog period, as systemd advises), or None."""
        if self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2_000_000

    # -- transport ------------------------------------------------------------------------------
    def _send(self, head: str | None, status: str | None = None) -> bool:
        if self._address is None:
            return False
        parts = [] if head is None else [head]
        if status is not None:
            parts.append("STATUS=" + _one_line(status))
        if not parts:
            return False
        message = "\n".join(parts)
        try:
            conn = self._connect()
            conn.notify(_as_sdnotify_str(message))
        except Exception as exc:  # any failure here must stay a log line
            self._conn = None  # reconnect next time: systemd may have re-created its socket
            if not self._failed:
                self._failed = True
                log.warning(
                    "notify.failed",
                    socket=self._address,
                    message=head or "STATUS",
                    error=f"{type(exc).__name__}: {exc}",
                    hint="systemd will not see READY/STATUS/WATCHDOG until this recovers",
                )
            return False
        if self._failed:
            self._failed = False
            log.info("notify.recovered", socket=self._address)
        return True

    def _connect(self) -> sdnotify.SystemdNotifier:
        if self._conn is None:
            # debug=True makes sdnotify raise instead of swallowing errors, so we can report them.
            old = os.environ.get("NOTIFY_SOCKET")
            if old == self._address:
                conn = sdnotify.SystemdNotifier(debug=True)
            else:  # an injected environment (tests): sdnotify reads only os.environ
                os.environ["NOTIFY_SOCKET"] = str(self._address)
                try:
                    conn = sdnotify.SystemdNotifier(debug=True)
                finally:
                    if old is None:
                        os.environ.pop("NOTIFY_SOCKET", None)
                    else:
                        os.environ["NOTIFY_SOCKET"] = old
            conn.socket.settimeout(_SEND_TIMEOUT_S)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.socket is not None:
            conn.socket.close()


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    try:
        usec = int(raw)
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = env.get("WATCHDOG_PID")
    # WATCHDOG_PID names the process the watchdog is for; a forked helper must not ping for us.
    if pid and pid.strip() != str(os.getpid()):
        return None
    return usec
