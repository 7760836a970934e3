"""The multi-node leader's side of the supervisor (node 0 of a group): the link its worker nodes
call (`grouplink.LeaderLink`) reads the engine's state here and reports what the workers say.
A worker's failure is the group's engine failing: its class goes to the lifecycle as a failure
line, and the leader's engine is killed at once (its ranks wait in a collective that cannot
complete); the lifecycle restarts the group on the same or the next profile.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog

from sglang_supervisor.core.actions import Exit
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.group import MemberFailed, View
from sglang_supervisor.core.phases import UP_PHASES, Phase
from sglang_supervisor.shell.links.grouplink import GroupCollector, LeaderLink, member_failure_line

if TYPE_CHECKING:
    from sglang_supervisor.shell.supervisor import Supervisor

log = structlog.get_logger("sglang_supervisor")


def leader_link(sup: Supervisor) -> LeaderLink | None:
    """The link for node 0 of a group (its collector registered for /metrics), else None."""
    group = sup.config.group
    if group is None or not group.leader:
        return None
    hooks = _LeaderHooks(sup)
    secret = sup.prep.group_secret
    assert secret is not None  # preflight reads it for every group (GroupSettings requires one)
    link = LeaderLink(group, secret, view=hooks.view, engine_running=hooks.engine_running,
                      on_failure=hooks.member_failed, on_progress=hooks.progress)
    sup.metrics.registry.register(GroupCollector(link))
    return link


class _LeaderHooks:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def view(self) -> View:
        sup = self.sup
        phase = sup.lifecycle.phase
        eng = sup.runner.engine
        if eng is None or eng.stopping is not None or phase in (Phase.STOPPING, Phase.RESTARTING):
            engine = "stopping" if eng is not None else "none"
        else:
            engine = "serving" if phase in UP_PHASES else "starting"
        assert sup.config.group is not None and sup.group is not None
        return View(sup.lifecycle.attempt, sup.lifecycle.profile, engine,  # type: ignore[arg-type]
                    sup.config.group.restart, dict(sup.group.book.claimed))

    def progress(self) -> None:
        self.sup.timers.note_output(time.monotonic())  # the stall timer watches the whole group's start

    def engine_running(self) -> bool:
        eng = self.sup.runner.engine
        return eng is not None and eng.stopping is None

    def member_failed(self, f: MemberFailed) -> None:
        sup = self.sup
        log.error("group.member_failed", node_rank=f.node_rank, failure_class=f.failure_class.value,
                  message=f.message, generation=sup.lifecycle.attempt)
        assert sup.config.group is not None
        if sup.config.group.restart == "external":
            sup.exit(Exit(ExitCode.GROUP_FAILED, f"node {f.node_rank} failed "
                          f"({f.failure_class.value}); restart: external"))
            return
        eng = sup.runner.engine
        if eng is None or eng.stopping is not None:
            return
        sup.feed(member_failure_line(f))
        sup.serving.quiet_probes()
        sup.runner.stop_for_member(f)
