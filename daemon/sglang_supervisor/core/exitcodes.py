"""The exit-code contract systemd and scripts rely on (README, units/, docs/)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # clean stop
    FAILURE = 1  # unexpected internal failure (a bug: please report)
    USAGE = 2  # bad command line
    ALL_PROFILES_FAILED = 69  # EX_UNAVAILABLE: every profile of the ladder failed
    # restart: external (LeaderWorkerSet): a node of the multi-node group failed; the orchestrator
    # recreates the whole group (group.py)
    GROUP_FAILED = 76  # EX_PROTOCOL
    TEMPORARY = 75  # EX_TEMPFAIL: GPU held by a foreign process, port busy... retry later
    CONFIG = 78  # EX_CONFIG: invalid configuration; systemd must not restart (RestartPreventExitStatus)
