"""The multi-node leader's side of the supervisor (node 0 of a group): the link its worker nodes
call (`grouplink.LeaderLink`) reads the engine's state here and reports what the workers say.
A worker's failure is the group's engine failing: its class goes to the lifecycle as a failure
line, and the leader's engine is killed at once (its ranks wait in a collective that cannot
complete); the lifecycle restarts the group on the same or the next profile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry

from sglang_supervisor.core.actions import Exit
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.group import MemberFailed, View
from sglang_supervisor.core.inputs import Input
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.phases import UP_PHASES, Phase
from sglang_supervisor.shell.current import Current
from sglang_supervisor.shell.engineproc.runner import Engine
from sglang_supervisor.shell.links.grouplink import GroupCollector, LeaderLink, member_failure_line
from sglang_supervisor.shell.timers import Timers

log = structlog.get_logger("sglang_supervisor")


@dataclass(frozen=True)
class LeaderParts:
    """What node 0's link reads and drives: the running engine (`engine()`), and the Supervisor's
    own `feed` (the member's failure line), `exit` and `stop_for_member` (quiet the probes, kill
    the engine at once)."""

    lifecycle: Lifecycle
    timers: Timers
    engine: Callable[[], Engine | None]
    feed: Callable[[Input], None]
    exit: Callable[[Exit], None]
    stop_for_member: Callable[[MemberFailed], None]


def leader_link(current: Current, registry: CollectorRegistry, parts: LeaderParts) -> LeaderLink | None:
    """The link for node 0 of a group (its collector registered for /metrics), else None."""
    group = current.config.group
    if group is None or not group.leader:
        return None
    hooks = _LeaderHooks(current, parts)
    secret = current.prep.group_secret
    assert secret is not None  # preflight reads it for every group (GroupSettings requires one)
    hooks.link = link = LeaderLink(group, secret, view=hooks.view, engine_running=hooks.engine_running,
                                   on_failure=hooks.member_failed, on_progress=hooks.progress)
    registry.register(GroupCollector(link))
    return link


class _LeaderHooks:
    def __init__(self, current: Current, parts: LeaderParts) -> None:
        self.current, self.parts = current, parts
        self.link: LeaderLink | None = None  # set once the link it serves exists

    def view(self) -> View:
        lifecycle = self.parts.lifecycle
        phase = lifecycle.phase
        eng = self.parts.engine()
        if eng is None or eng.stopping is not None or phase in (Phase.STOPPING, Phase.RESTARTING):
            engine = "stopping" if eng is not None else "none"
        else:
            engine = "serving" if phase in UP_PHASES else "starting"
        group = self.current.config.group
        assert group is not None and self.link is not None
        return View(lifecycle.attempt, lifecycle.profile, engine,  # type: ignore[arg-type]
                    group.restart, dict(self.link.book.claimed))

    def progress(self) -> None:
        self.parts.timers.note_output(time.monotonic())  # the stall timer watches the whole group's start

    def engine_running(self) -> bool:
        eng = self.parts.engine()
        return eng is not None and eng.stopping is None

    def member_failed(self, f: MemberFailed) -> None:
        parts = self.parts
        log.error("group.member_failed", node_rank=f.node_rank, failure_class=f.failure_class.value,
                  message=f.message, generation=parts.lifecycle.attempt)
        group = self.current.config.group
        assert group is not None
        if group.restart == "external":
            parts.exit(Exit(ExitCode.GROUP_FAILED, f"node {f.node_rank} failed "
                            f"({f.failure_class.value}); restart: external"))
            return
        eng = parts.engine()
        if eng is None or eng.stopping is not None:
            return
        parts.feed(member_failure_line(f))
        parts.stop_for_member(f)
