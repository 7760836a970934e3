"""The lifecycle's phases: where one supervisor run stands (STATUS=, `/status`, the state metric)."""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    PREFLIGHT = "preflight"
    LAUNCHING = "launching"
    LOADING_WEIGHTS = "loading_weights"
    CAPTURING_GRAPHS = "capturing_graphs"
    WARMING_UP = "warming_up"
    READY = "ready"
    SERVING = "serving"
    DEGRADED = "degraded"
    RESTARTING = "restarting"
    WAITING = "waiting"  # for a temporary condition (port, GPU memory) to clear
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


STARTING_PHASES = frozenset(
    {Phase.LAUNCHING, Phase.LOADING_WEIGHTS, Phase.CAPTURING_GRAPHS, Phase.WARMING_UP}
)
UP_PHASES = frozenset({Phase.READY, Phase.SERVING, Phase.DEGRADED})
# A run in one of these is over: the lifecycle answers nothing more.
FINAL_PHASES = frozenset({Phase.STOPPED, Phase.FAILED})
