"""Transitional re-export of the lifecycle's old home (issue 13 split it into small modules).

Only shell/supervisor.py still imports from here, so that the helper reshaping it can merge;
new code imports from the modules that hold each name: phases, reasons, inputs, actions,
readiness, attempt, failover, regression_action, lifecycle. Delete this module once nothing
imports it.
"""

from __future__ import annotations

from sglang_supervisor.core.actions import (
    Action,
    CancelTimer,
    Exit,
    Launch,
    Log,
    LogLevel,
    MarkBad,
    MarkGood,
    NotifyReady,
    NotifyReloading,
    NotifyStatus,
    NotifyStopping,
    RunReadyProbe,
    SetTimer,
    StopEngine,
    WaitTemporary,
)
from sglang_supervisor.core.failover import (
    ARGPARSE_EXIT,
    CONFIG_FAILURES,
    GENERIC_FAILURES,
    TEMPORARY_FAILURES,
    choose_next,
    classify_failure,
    corroborated,
    ladder_order,
    skipped_known_bad,
)
from sglang_supervisor.core.inputs import (
    FAILURE_GRACE_TIMER,
    STALL_TIMER,
    START_TIMER,
    TEMPORARY_TIMER,
    DecodeProgress,
    EngineExited,
    GpuBusy,
    HealthFailed,
    HealthOk,
    Input,
    Launched,
    LaunchFailed,
    PassiveThroughput,
    PortBusy,
    ProbeFailed,
    ProbeOk,
    RegressionDecision,
    RegressionKind,
    ReloadRequested,
    Settings,
    Start,
    StopRequested,
    SupervisorInput,
    TemporaryCleared,
    TimerFired,
)
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.lifecycle_base import STATUS_REFRESH_S
from sglang_supervisor.core.lifecycle_wait import TEMPORARY_RETRY_MAX_S
from sglang_supervisor.core.phases import STARTING_PHASES, UP_PHASES, Phase
from sglang_supervisor.core.readiness import CaptureKey
from sglang_supervisor.core.reasons import RestartCause

RESTART_REGRESSION = RestartCause.REGRESSION.value
RESTART_RELOAD = RestartCause.RELOAD.value

__all__ = [
    "ARGPARSE_EXIT", "CONFIG_FAILURES", "FAILURE_GRACE_TIMER", "GENERIC_FAILURES",
    "RESTART_REGRESSION", "RESTART_RELOAD", "STALL_TIMER", "STARTING_PHASES", "START_TIMER",
    "STATUS_REFRESH_S", "TEMPORARY_FAILURES", "TEMPORARY_RETRY_MAX_S", "TEMPORARY_TIMER",
    "UP_PHASES", "Action", "CancelTimer", "CaptureKey", "DecodeProgress", "EngineExited", "Exit",
    "GpuBusy", "HealthFailed", "HealthOk", "Input", "Launch", "LaunchFailed", "Launched",
    "Lifecycle", "Log", "LogLevel", "MarkBad", "MarkGood", "NotifyReady", "NotifyReloading",
    "NotifyStatus", "NotifyStopping", "PassiveThroughput", "Phase", "PortBusy", "ProbeFailed",
    "ProbeOk", "RegressionDecision", "RegressionKind", "ReloadRequested", "RunReadyProbe",
    "SetTimer", "Settings", "Start", "StopEngine", "StopRequested", "SupervisorInput",
    "TemporaryCleared", "TimerFired", "WaitTemporary", "choose_next", "classify_failure",
    "corroborated", "ladder_order", "skipped_known_bad",
]
