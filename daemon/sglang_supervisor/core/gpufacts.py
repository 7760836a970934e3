"""What NVML says about a GPU, as plain data: the shell's adapter (shell/telemetry/gpu.py) fills it in, the
doctor's rules (core/audit/) and the regression rules (core/regression.py) read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# NVML clock-event ("throttle") reason bits; a stable part of the NVML ABI (nvml.h).
CLOCK_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
CLOCK_REASON_NAMES: tuple[str, ...] = tuple(name for _, name in CLOCK_REASONS)
# Reasons that mean "the GPU runs slower than it could": idle and app-clock settings do not.
SLOWDOWN_REASONS = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)

P2PLink = Literal["nvlink", "pcie-p2p", "none", "unknown"]


def decode_clock_reasons(mask: int) -> tuple[str, ...]:
    """Bitmask → reason names; bits NVML may add later come out as `other`."""
    names = [name for bit, name in CLOCK_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_REASONS:
        known |= bit
    if mask & ~known:
        names.append("other")
    return tuple(names)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None where the driver does not tell (WDDM, some MIG setups)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    compute_capability: str | None  # "9.0" on an H100/H200
    driver: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_ratio: float | None  # 0..1
    temperature_c: float | None
    temperature_slowdown_c: float | None  # where the board starts slowing itself down
    power_w: float | None
    power_limit_w: float | None
    sm_clock_hz: float | None
    throttle_reasons: tuple[str, ...]
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True, slots=True)
class ForeignProcess:
    gpu_index: int
    gpu_uuid: str
    pid: int
    used_bytes: int | None
    command: str | None  # /proc/PID/comm when visible


def engine_gpus(gpus: list[GpuInfo] | None, pids: set[int]) -> list[dict[str, object]] | None:
    """For `/status` (and `sglang-supervisor status`): the GPUs the engine's processes hold memory
    on, with their memory; None when NVML is not there to tell."""
    if gpus is None:
        return None
    rows: list[dict[str, object]] = []
    for g in gpus:
        held = [p for p in g.processes if p.pid in pids]
        if held:
            rows.append({"index": g.index, "name": g.name,
                         "engine_bytes": sum(p.used_bytes or 0 for p in held),
                         "memory_used_bytes": g.memory_used_bytes,
                         "memory_total_bytes": g.memory_total_bytes})
    return rows
