"""Thin NVML adapter (nvidia-ml-py's `pynvml`): GPU telemetry, who holds GPU memory, P2P links.

Without NVML (no driver, no GPU, a container without the library) every function degrades:
`snapshot()` returns None, memory questions answer 0, one warning is logged, nothing raises.
A single NVML call that fails (NotSupported on some boards) leaves that one field None.

PIDs are those NVML reports: host PIDs. Inside a PID namespace they do not match ours; callers
then see every process as foreign, which errs on the side of explaining a slowdown rather than
restarting.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import structlog

# The plain facts live in core (the doctor and the regression rules read them without NVML);
# callers of this adapter keep finding them here.
from sglang_supervisor.core.gpufacts import (
    CLOCK_REASON_NAMES,
    CLOCK_REASONS,
    SLOWDOWN_REASONS,
    ForeignProcess,
    GpuInfo,
    GpuProcess,
    P2PLink,
    decode_clock_reasons,
)

__all__ = [
    "CLOCK_REASONS",
    "CLOCK_REASON_NAMES",
    "SLOWDOWN_REASONS",
    "ForeignProcess",
    "GpuInfo",
    "GpuProcess",
    "Nvml",
    "P2PLink",
    "decode_clock_reasons",
    "default",
    "descendant_pids",
    "find_foreign",
    "foreign_processes",
    "held_by",
    "lists_any",
    "memory_held_by",
    "nvml_available",
    "p2p_link",
    "release_done",
    "release_target",
    "snapshot",
    "total_used",
    "wait_for_release",
]

log = structlog.get_logger(__name__)

T = TypeVar("T")

def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """One NVML session. `module` is injectable so tests can hand in a fake `pynvml`."""

    def __init__(self, module: Any | None = None, loader: Callable[[str], Any] = importlib.import_module):
        self._module: Any = module
        self._loader = loader
        self._ready: bool | None = None
        self.unavailable_reason: str | None = None

    def available(self) -> bool:
        if self._ready is None:
            try:
                if self._module is None:
                    self._module = self._loader("pynvml")
                self._module.nvmlInit()
                self._ready = True
            except Exception as exc:  # NVMLError, ImportError, OSError: all mean "no NVML here"
                self._ready = False
                self.unavailable_reason = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "gpu.nvml_unavailable",
                    reason=self.unavailable_reason,
                    effect="no GPU metrics, throttle explanations or memory-release checks",
                )
        return self._ready

    def _call(self, fn: Callable[..., T], *args: object) -> T | None:
        try:
            return fn(*args)
        except Exception:  # one unsupported query must not hide the rest of the snapshot
            return None

    def _handles(self) -> list[Any] | None:
        if not self.available():
            return None
        nv = self._module
        count = self._call(nv.nvmlDeviceGetCount)
        if count is None:
            return None
        handles = [self._call(nv.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        return handles if all(h is not None for h in handles) else None

    def _reasons(self, handle: Any) -> tuple[str, ...]:
        nv = self._module
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        mask = self._call(getter, handle) if getter is not None else None
        return decode_clock_reasons(int(mask)) if mask is not None else ()

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        procs = self._call(self._module.nvmlDeviceGetComputeRunningProcesses, handle) or []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(GpuProcess(pid=int(p.pid), used_bytes=int(used) if used is not None else None))
        return tuple(out)

    def snapshot(self) -> list[GpuInfo] | None:
        handles = self._handles()
        if handles is None:
            return None
        nv = self._module
        driver = self._call(nv.nvmlSystemGetDriverVersion)
        gpus = []
        for index, h in enumerate(handles):
            cc = self._call(nv.nvmlDeviceGetCudaComputeCapability, h)
            mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
            util = self._call(nv.nvmlDeviceGetUtilizationRates, h)
            temp = self._call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            slow = self._call(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
            power_mw = self._call(nv.nvmlDeviceGetPowerUsage, h)
            limit_mw = self._call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            sm_mhz = self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            uuid = self._call(nv.nvmlDeviceGetUUID, h)
            name = self._call(nv.nvmlDeviceGetName, h)
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=_text(uuid) if uuid is not None else f"GPU-{index}",
                    name=_text(name) if name is not None else "unknown",
                    compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                    driver=_text(driver) if driver is not None else None,
                    memory_used_bytes=int(mem.used) if mem is not None else None,
                    memory_total_bytes=int(mem.total) if mem is not None else None,
                    utilization_ratio=float(util.gpu) / 100.0 if util is not None else None,
                    temperature_c=float(temp) if temp is not None else None,
                    temperature_slowdown_c=float(slow) if slow is not None else None,
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                    power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
                    sm_clock_hz=sm_mhz * 1e6 if sm_mhz is not None else None,
                    throttle_reasons=self._reasons(h),
                    processes=self._processes(h),
                )
            )
        return gpus

    def p2p_link(self, gpu_a: int, gpu_b: int) -> P2PLink:
        handles = self._handles()
        if handles is None or not (0 <= gpu_a < len(handles) and 0 <= gpu_b < len(handles)):
            return "unknown"
        nv = self._module
        ok = nv.NVML_P2P_STATUS_OK
        a, b = handles[gpu_a], handles[gpu_b]
        nvlink = self._call(nv.nvmlDeviceGetP2PStatus, a, b, nv.NVML_P2P_CAPS_INDEX_NVLINK)
        if nvlink == ok:
            return "nvlink"
        read = self._call(nv.nvmlDeviceGetP2PStatus, a, b, nv.NVML_P2P_CAPS_INDEX_READ)
        if read == ok:
            return "pcie-p2p"
        if nvlink is None and read is None:
            return "unknown"
        return "none"


_default = Nvml()


def default() -> Nvml:
    return _default


def nvml_available() -> bool:
    return _default.available()


def snapshot() -> list[GpuInfo] | None:
    return _default.snapshot()


def p2p_link(gpu_a: int, gpu_b: int) -> P2PLink:
    """How two GPUs talk: `nvlink`, `pcie-p2p`, `none`, or `unknown` (no NVML, bad index)."""
    return _default.p2p_link(gpu_a, gpu_b)


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or None
    except OSError:
        return None


def find_foreign(gpus: Iterable[GpuInfo], our_pids: set[int],
                 gpu_indices: set[int] | None = None) -> list[ForeignProcess]:
    """Pure part of `foreign_processes`; `command` is filled by the caller."""
    return [
        ForeignProcess(g.index, g.uuid, p.pid, p.used_bytes, None)
        for g in gpus
        if gpu_indices is None or g.index in gpu_indices
        for p in g.processes
        if p.pid not in our_pids
    ]


def foreign_processes(our_pids: set[int], gpu_indices: set[int] | None = None) -> list[ForeignProcess]:
    """Compute processes on (our) GPUs that are not ours; [] without NVML."""
    gpus = snapshot()
    if gpus is None:
        return []
    return [
        ForeignProcess(f.gpu_index, f.gpu_uuid, f.pid, f.used_bytes, _comm(f.pid))
        for f in find_foreign(gpus, our_pids, gpu_indices)
    ]


def held_by(gpus: Iterable[GpuInfo], pids: Iterable[int]) -> int:
    wanted = set(pids)
    return sum(p.used_bytes or 0 for g in gpus for p in g.processes if p.pid in wanted)


def memory_held_by(pids: Iterable[int]) -> int:
    """Bytes of GPU memory the given PIDs hold across all GPUs; 0 without NVML."""
    gpus = snapshot()
    return held_by(gpus, pids) if gpus is not None else 0


def total_used(gpus: Iterable[GpuInfo], gpu_indices: set[int] | None = None) -> int:
    return sum(
        g.memory_used_bytes or 0 for g in gpus if gpu_indices is None or g.index in gpu_indices
    )


def descendant_pids(root: int, proc: Path = Path("/proc")) -> set[int]:
    """`root` and every process below it (the engine's schedulers, detokenizer), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: fields start after the last ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) >= 2 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def release_done(gpus: list[GpuInfo], target: set[int] | int, slack_bytes: int,
                 gpu_indices: set[int] | None) -> bool:
    """Pure: has the memory been given back? `target` is the PIDs that held it, or the bytes that
    were in use on the GPUs before our engine started (a baseline)."""
    if isinstance(target, int):
        return total_used(gpus, gpu_indices) <= target + slack_bytes
    return not any(p.pid in target for g in gpus for p in g.processes)


def release_target(gpus: list[GpuInfo] | None, pids: set[int], baseline: int | None,
                   pids_comparable: bool = False) -> set[int] | int:
    """Pure: what a relaunch waits for. Our PIDs where NVML lists any of them, or where it listed
    them while the engine served (`pids_comparable`: NVML's PIDs are ours, no PID namespace in
    between), so none listed now means released: exact, and a process that came onto the GPU
    after our first start cannot hold every relaunch for the whole timeout. Else the bytes in use
    before our first start, as before."""
    if gpus is not None and (pids_comparable or lists_any(gpus, pids)):
        return pids
    return baseline if baseline is not None else pids


def lists_any(gpus: list[GpuInfo] | None, pids: set[int]) -> bool:
    return gpus is not None and any(p.pid in pids for g in gpus for p in g.processes)


async def wait_for_release(
    pids_or_baseline: Iterable[int] | int,
    timeout_s: float,
    *,
    gpu_indices: set[int] | None = None,
    poll_s: float = 0.5,
    slack_bytes: int = 512 * 1024 * 1024,
    no_nvml_wait_s: float = 5.0,
    nvml: Nvml | None = None,
) -> bool | None:
    """Wait, bounded by `timeout_s`, until a dead engine's GPU memory is free before relaunching
    (SGLang's children die with PDEATHSIG, but the driver frees their memory seconds later).

    True: released. False: still held at the deadline. None: no NVML, so after a short fixed wait
    (`no_nvml_wait_s`, capped by the timeout) we cannot tell.
    """
    nv = nvml or _default
    target: set[int] | int = (
        pids_or_baseline if isinstance(pids_or_baseline, int) else set(pids_or_baseline)
    )
    if not nv.available():
        wait = min(no_nvml_wait_s, timeout_s)
        log.info("gpu.release_unverified", waited_s=wait, reason="NVML unavailable")
        await asyncio.sleep(wait)
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        gpus = nv.snapshot()
        if gpus is not None and release_done(gpus, target, slack_bytes, gpu_indices):
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            held: int | None = None
            if gpus is not None:
                held = total_used(gpus, gpu_indices) if isinstance(target, int) else held_by(gpus, target)
            log.warning("gpu.memory_not_released", timeout_s=timeout_s, held_bytes=held)
            return False
        await asyncio.sleep(min(poll_s, remaining))
