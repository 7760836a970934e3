"""NVML adapter: decoding with a fake `pynvml`, and graceful degradation without one."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_supervisor.shell.telemetry import gpu


class FakeNVMLError(Exception):
    pass


def _unsupported(*_a: object) -> Any:
    raise FakeNVMLError("Not Supported")


def fake_pynvml(procs: list[list[tuple[int, int | None]]] | None = None, *, init_fails: bool = False,
                throttle_mask: int = 0x4 | 0x40 | 0x2000) -> SimpleNamespace:
    """Two GPUs: an H200 with full telemetry, and a board where several queries are unsupported."""
    procs = procs if procs is not None else [[(100, 2 * 2**30), (200, 2**30)], []]

    def init() -> None:
        if init_fails:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def proc_list(h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs[h]]

    def p2p(a: int, b: int, index: int) -> int:
        if index == 2:  # NVLINK
            return 0 if {a, b} == {0, 1} else 5
        return 0

    return SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_TEMPERATURE_GPU=0,
        NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1,
        NVML_CLOCK_SM=1,
        NVML_P2P_STATUS_OK=0,
        NVML_P2P_CAPS_INDEX_READ=0,
        NVML_P2P_CAPS_INDEX_NVLINK=2,
        nvmlInit=init,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h:04d}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA RTX A6000",
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0) if h == 0 else _unsupported(),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=3 * 2**30, total=141 * 2**30),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetTemperature=lambda h, s: 71,
        nvmlDeviceGetTemperatureThreshold=lambda h, t: 87 if h == 0 else _unsupported(),
        nvmlDeviceGetPowerUsage=lambda h: 650_500 if h == 0 else _unsupported(),
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetClockInfo=lambda h, c: 1980,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: throttle_mask if h == 0 else 0x1,
        nvmlDeviceGetComputeRunningProcesses=proc_list,
        nvmlDeviceGetP2PStatus=p2p,
    )


def test_decode_clock_reasons() -> None:
    assert gpu.decode_clock_reasons(0) == ()
    assert gpu.decode_clock_reasons(0x1) == ("gpu_idle",)
    assert gpu.decode_clock_reasons(0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")
    assert gpu.decode_clock_reasons(0x2000 | 0x8) == ("hw_slowdown", "other")


def test_snapshot_decodes_units_and_tolerates_unsupported_queries() -> None:
    nv = gpu.Nvml(fake_pynvml())
    snap = nv.snapshot()
    assert snap is not None and len(snap) == 2
    h200, other = snap
    assert h200.name == "NVIDIA H200" and h200.uuid == "GPU-0000"
    assert h200.compute_capability == "9.0"
    assert h200.driver == "580.159.04"
    assert h200.memory_used_bytes == 3 * 2**30 and h200.memory_total_bytes == 141 * 2**30
    assert h200.utilization_ratio == pytest.approx(0.87)
    assert h200.temperature_c == 71 and h200.temperature_slowdown_c == 87
    assert h200.power_w == pytest.approx(650.5) and h200.power_limit_w == pytest.approx(700.0)
    assert h200.sm_clock_hz == pytest.approx(1.98e9)
    assert h200.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown", "other")
    assert h200.processes == (gpu.GpuProcess(100, 2 * 2**30), gpu.GpuProcess(200, 2**30))
    # The second board: unsupported queries leave None, the rest is still there.
    assert other.compute_capability is None and other.power_w is None and other.temperature_slowdown_c is None
    assert other.name == "NVIDIA RTX A6000" and other.throttle_reasons == ("gpu_idle",)


def test_older_pynvml_throttle_reason_name_is_used() -> None:
    fake = fake_pynvml(throttle_mask=0x8)
    fake.nvmlDeviceGetCurrentClocksThrottleReasons = fake.nvmlDeviceGetCurrentClocksEventReasons
    del fake.nvmlDeviceGetCurrentClocksEventReasons
    snap = gpu.Nvml(fake).snapshot()
    assert snap is not None and snap[0].throttle_reasons == ("hw_slowdown",)


def test_foreign_and_held_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml([[(100, 2**30), (4242, 5 * 2**30)], [(7, None)]])
    monkeypatch.setattr(gpu, "_default", gpu.Nvml(fake))
    foreign = gpu.foreign_processes({100})
    assert [(f.gpu_index, f.pid, f.used_bytes) for f in foreign] == [(0, 4242, 5 * 2**30), (1, 7, None)]
    assert [f.pid for f in gpu.foreign_processes({100}, gpu_indices={0})] == [4242]
    assert gpu.memory_held_by({100, 4242}) == 6 * 2**30
    assert gpu.memory_held_by({1}) == 0


def test_p2p_link() -> None:
    nv = gpu.Nvml(fake_pynvml())
    assert nv.p2p_link(0, 1) == "nvlink"
    assert nv.p2p_link(0, 0) == "pcie-p2p"
    assert nv.p2p_link(0, 9) == "unknown"


def test_without_nvml_everything_degrades_and_tries_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def loader(name: str) -> Any:
        calls.append(name)
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu, "_default", gpu.Nvml(loader=loader))
    assert not gpu.nvml_available()
    assert gpu.snapshot() is None
    assert gpu.foreign_processes({1}) == []
    assert gpu.memory_held_by({1}) == 0
    assert gpu.p2p_link(0, 1) == "unknown"
    assert calls == ["pynvml"]  # tried once, then remembered
    assert "ImportError" in (gpu.default().unavailable_reason or "")
    assert asyncio.run(gpu.wait_for_release({1}, timeout_s=5, no_nvml_wait_s=0)) is None


def test_init_failure_is_unavailable() -> None:
    nv = gpu.Nvml(fake_pynvml(init_fails=True))
    assert not nv.available()
    assert nv.snapshot() is None


def test_wait_for_release_polls_until_pids_are_gone() -> None:
    state = {"polls": 0}
    fake = fake_pynvml()

    def procs(h: int) -> list[SimpleNamespace]:
        state["polls"] += 1
        held = state["polls"] <= 4  # two GPUs per snapshot: gone on the third snapshot
        return [SimpleNamespace(pid=100, usedGpuMemory=2**30)] if held and h == 0 else []

    fake.nvmlDeviceGetComputeRunningProcesses = procs
    released = asyncio.run(gpu.wait_for_release({100}, timeout_s=30, poll_s=0, nvml=gpu.Nvml(fake)))
    assert released is True
    assert state["polls"] == 6


def test_wait_for_release_times_out_and_baseline_mode() -> None:
    nv = gpu.Nvml(fake_pynvml())  # pid 100 never leaves; 3 GiB used on each GPU
    assert asyncio.run(gpu.wait_for_release({100}, timeout_s=0, poll_s=0, nvml=nv)) is False
    assert asyncio.run(gpu.wait_for_release(6 * 2**30, timeout_s=0, slack_bytes=0, nvml=nv)) is True
    one_gpu = gpu.wait_for_release(2**30, timeout_s=0, slack_bytes=0, gpu_indices={0}, nvml=nv)
    assert asyncio.run(one_gpu) is False


def _one_gpu(used: int, *pids: tuple[int, int]) -> gpu.GpuInfo:
    return gpu.GpuInfo(0, "GPU-0", "H100", "9.0", "580", used, 80 * 2**30, None, None, None, None,
                       None, None, (), tuple(gpu.GpuProcess(p, b) for p, b in pids))


def test_release_target_waits_on_our_pids_where_nvml_lists_them() -> None:
    # Our engine (pid 100) still listed next to a foreign load (pid 7) that came after our first
    # start: wait on our PIDs, not on a baseline the foreign load keeps exceeded.
    both = [_one_gpu(5 * 2**30, (100, 4 * 2**30), (7, 2**30))]
    assert gpu.release_target(both, {100, 101}, baseline=0) == {100, 101}
    # Ours not listed (a PID namespace, or already gone): the bytes before our first start.
    foreign_only = [_one_gpu(2**30, (7, 2**30))]
    assert gpu.release_target(foreign_only, {100}, baseline=0) == 0
    assert gpu.release_target(None, {100}, baseline=3) == 3
    assert gpu.release_target(foreign_only, {100}, baseline=None) == {100}
    # With that target the foreign load no longer holds the relaunch (it did with the baseline).
    assert gpu.release_done(foreign_only, gpu.release_target(both, {100}, 0), 0, None) is True
    assert gpu.release_done(foreign_only, 0, 0, None) is False


def test_descendant_pids_of_this_process() -> None:
    pids = gpu.descendant_pids(os.getppid())
    assert os.getpid() in pids and os.getppid() in pids


def test_release_target_takes_ours_gone_for_released_where_nvml_listed_them_serving() -> None:
    # Round 10 on an H100: the engine had already left NVML's list when the relaunch looked, a
    # foreign load held the baseline exceeded, and the relaunch waited the whole gpu_release_s.
    # Where NVML listed our PIDs while the engine served, their absence is the release.
    foreign_only = [_one_gpu(2**30, (7, 2**30))]
    target = gpu.release_target(foreign_only, {100}, baseline=0, pids_comparable=True)
    assert target == {100}
    assert gpu.release_done(foreign_only, target, 0, None) is True
    # Never listed (a PID namespace between us and the driver): the baseline, as before.
    assert gpu.release_target(foreign_only, {100}, baseline=0, pids_comparable=False) == 0
    # No NVML now: nothing to compare, the baseline.
    assert gpu.release_target(None, {100}, baseline=3, pids_comparable=True) == 3


def test_lists_any_reads_every_gpu() -> None:
    two = [_one_gpu(0, (7, 1)), _one_gpu(0, (100, 1))]
    assert gpu.lists_any(two, {100}) is True
    assert gpu.lists_any(two, {5}) is False
    assert gpu.lists_any(None, {100}) is False
