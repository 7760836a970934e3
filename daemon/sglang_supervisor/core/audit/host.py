"""The host: GPUs and their memory, the TP link, /dev/shm, memlock, ports, directories, the model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sglang_supervisor.core.audit.findings import Finding
from sglang_supervisor.core.gpufacts import GpuInfo, P2PLink
from sglang_supervisor.engine.modelinfo import ModelInfo


@dataclass(frozen=True)
class HostFacts:
    nvml: bool
    gpus: tuple[GpuInfo, ...] = ()
    foreign: tuple[str, ...] = ()  # "GPU0 pid 123 (python3 train.py) 40.0 GiB" lines
    # The running engine's own GPU processes (of the server on the engine port): "our engine (pid
    # 31, sglang::scheduler_TP0) on GPU0, 70.0 GiB" lines, and the bytes it holds per GPU index
    # (memory a restart of the engine gets back).
    engine_gpu: tuple[str, ...] = ()
    engine_gpu_bytes: Mapping[int, int] = field(default_factory=dict)
    tp_link: P2PLink | None = None
    shm_bytes: int | None = None
    memlock_soft: int | None = None  # -1: unlimited
    ports_busy: Mapping[int, str] = field(default_factory=dict)  # port -> what it is for
    # busy ports held by a running SGLang or sglang-supervisor: port -> who (pid, started by whom)
    ports_running: Mapping[int, str] = field(default_factory=dict)
    ports_checked: Mapping[int, str] = field(default_factory=dict)
    # path -> (what it is for, 'ok' | 'missing' | 'unwritable: <reason>')
    dirs: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    model: ModelInfo | None = None
    model_error: str | None = None


_GIB = 1024**3


def host_findings(h: HostFacts, tp_size: int, mem_fraction: float | None = None) -> list[Finding]:
    gpu = _gpu_findings(h, tp_size) + _weights_fit(h, tp_size, mem_fraction) if h.nvml else _no_nvml()
    return (gpu + _link_findings(h, tp_size) + _limit_findings(h, tp_size) + _port_findings(h)
            + _dir_findings(h) + _model_findings(h))


def _no_nvml() -> list[Finding]:
    """No GPU facts: say so once, the other host rules still run."""
    return [
        Finding(
            "warning",
            "host",
            "NVML is not available: GPU checks skipped",
            "no NVIDIA driver/library here (or no GPU); the audit continues without GPU facts",
            "run doctor on the GPU host",
            "host.nvml",
        )
    ]


def _gpu_findings(h: HostFacts, tp_size: int) -> list[Finding]:
    """Each GPU and their count against --tp-size."""
    out: list[Finding] = []
    for g in h.gpus:
        free = (
            (g.memory_total_bytes - g.memory_used_bytes)
            if (g.memory_total_bytes is not None and g.memory_used_bytes is not None)
            else None
        )
        out.append(
            Finding(
                "info",
                "host",
                f"GPU{g.index}: {g.name}, SM {g.compute_capability or '?'}, "
                f"driver {g.driver or '?'}"
                + (
                    f", {free / _GIB:.1f} of {(g.memory_total_bytes or 0) / _GIB:.1f} GiB free"
                    if free is not None
                    else ""
                ),
                "",
                "",
                "host.gpu",
            )
        )
    if len(h.gpus) < tp_size:
        out.append(
            Finding(
                "error",
                "host",
                f"--tp-size {tp_size} needs {tp_size} GPUs; {len(h.gpus)} visible",
                "SGLang starts one scheduler per GPU",
                f"--tp-size {len(h.gpus) or 1}, or check CUDA_VISIBLE_DEVICES",
                "host.gpu_count",
            )
        )
    return out + _gpu_processes(h)


def _gpu_processes(h: HostFacts) -> list[Finding]:
    """Who holds GPU memory now: the running engine's own processes, and anyone else's."""
    out: list[Finding] = []
    for line in h.engine_gpu:
        out.append(
            Finding(
                "info",
                "host",
                line,
                "a process of the SGLang serving the engine port; its memory is counted as free "
                "below",
                "",
                "host.engine_gpu",
            )
        )
    for line in h.foreign:
        out.append(
            Finding(
                "warning",
                "host",
                f"foreign GPU process: {line}",
                "another process holds GPU memory: the engine may not fit (the supervisor then exits "
                "75 and systemd retries)",
                "stop it, or lower --mem-fraction-static",
                "host.foreign",
            )
        )
    return out


def _weights_fit(h: HostFacts, tp_size: int, mem_fraction: float | None) -> list[Finding]:
    """The weights' share per GPU against the memory the engine may take (its own counted as free)."""
    out: list[Finding] = []
    model = h.model
    if model is not None and model.weights_gb_estimate and h.gpus[:tp_size]:
        per_gpu = model.weights_gb_estimate * 1e9 / tp_size
        frees = [(g.memory_total_bytes or 0) - (g.memory_used_bytes or 0)
                 + h.engine_gpu_bytes.get(g.index, 0) for g in h.gpus[:tp_size]]
        budget = min(frees) * (mem_fraction or 0.9)
        if per_gpu > budget:
            out.append(
                Finding(
                    "error",
                    "host",
                    f"the weights (~{per_gpu / _GIB:.1f} GiB per GPU) do not fit",
                    f"{budget / _GIB:.1f} GiB per GPU usable at mem fraction {mem_fraction or 0.9}",
                    "more GPUs (--tp-size), a quantized model, or free the GPUs",
                    "host.memory",
                )
            )
    return out


def _link_findings(h: HostFacts, tp_size: int) -> list[Finding]:
    """How the TP GPUs talk to each other."""
    out: list[Finding] = []
    if tp_size > 1:
        if h.tp_link in ("nvlink", "pcie-p2p"):
            out.append(Finding("ok", "host", f"TP GPUs linked by {h.tp_link}", "", "", "host.link"))
        elif h.tp_link == "none":
            out.append(
                Finding(
                    "warning",
                    "host",
                    "no peer-to-peer link between the TP GPUs",
                    "every allreduce goes through host memory: tensor parallel decode is slow",
                    "check the PCIe topology / IOMMU (nvidia-smi topo -m)",
                    "host.link",
                )
            )
    return out


def _limit_findings(h: HostFacts, tp_size: int) -> list[Finding]:
    """Shared memory and locked memory, which multi-GPU runs need."""
    out: list[Finding] = []
    if h.shm_bytes is not None and tp_size > 1 and h.shm_bytes < _GIB:
        out.append(
            Finding(
                "warning",
                "host",
                f"/dev/shm is only {h.shm_bytes / 2**20:.0f} MiB",  # noqa: S108 (a fact, not a file)
                "NCCL uses shared memory between ranks; small /dev/shm (containers: 64 MiB) breaks "
                "or slows multi-GPU runs",
                "remount /dev/shm bigger (docker: --shm-size 16g)",
                "host.shm",
            )
        )
    if h.memlock_soft is not None and h.memlock_soft != -1 and h.memlock_soft < 64 * 2**20:
        out.append(
            Finding(
                "info",
                "host",
                f"RLIMIT_MEMLOCK is {h.memlock_soft // 1024} KiB",
                "pinned host memory (NCCL, CPU offload) prefers unlimited locked memory",
                "LimitMEMLOCK=infinity in the unit",
                "host.memlock",
            )
        )
    return out


def _port_findings(h: HostFacts) -> list[Finding]:
    """Ports the engine will bind: free, held by a running SGLang/supervisor, or taken."""
    out: list[Finding] = []
    for port, what in h.ports_busy.items():
        if port in h.ports_running:
            out.append(
                Finding(
                    "info",
                    "host",
                    f"port {port} ({what}): {h.ports_running[port]}",
                    "doctor checks the host as if nothing ran; a running service holds its own ports",
                    "nothing to do if that is this service; otherwise stop that server before starting "
                    "this one, or give this one another port",
                    "host.port_running",
                )
            )
            continue
        out.append(
            Finding(
                "error",
                "host",
                f"port {port} ({what}) is already in use",
                "the engine (or its side server) cannot bind it and exits",
                "stop the other listener or change the port in the config",
                "host.port",
            )
        )
    free_ports = [f"{p} ({w})" for p, w in h.ports_checked.items() if p not in h.ports_busy]
    if free_ports:
        out.append(Finding("ok", "host", "ports free: " + ", ".join(free_ports), "", "", "host.port"))
    return out


def _dir_findings(h: HostFacts) -> list[Finding]:
    """The state, log and runtime directories."""
    out: list[Finding] = []
    for path, (purpose, status) in h.dirs.items():
        if status == "ok":
            out.append(Finding("ok", "host", f"{purpose} {path} is writable", "", "", "host.dir"))
        elif status == "missing":
            out.append(
                Finding(
                    "info",
                    "host",
                    f"{purpose} {path} does not exist yet",
                    "the unit's StateDirectory=/LogsDirectory=/RuntimeDirectory= create it at start",
                    f"when running by hand: install -d -o <service user> {path}",
                    "host.dir",
                )
            )
        else:
            out.append(
                Finding(
                    "warning",
                    "host",
                    f"{purpose} {path} is not writable by this user",
                    status + " (fine if the service runs as another user who can write it)",
                    f"chown it to the service user (install -d -o <user> {path})",
                    "host.dir",
                )
            )
    return out


def _model_findings(h: HostFacts) -> list[Finding]:
    """The model's config.json as SGLang will read it."""
    out: list[Finding] = []
    if h.model_error:
        out.append(
            Finding(
                "error",
                "host",
                "model config unreadable",
                h.model_error,
                "fix engine.model_path",
                "host.model",
            )
        )
    elif h.model is not None:
        m = h.model
        traits = [
            (
                "multimodal (SGLang classes it as a VLM)"
                if m.sglang_multimodal
                else "has a vision tower"
                if m.has_vision_config
                else "text-only"
            ),
            f"hybrid: {m.linear_attention_layers} linear-attention + "
            f"{m.full_attention_layers} full-attention layers"
            if m.hybrid
            else "standard attention",
            f"MTP/NEXTN head: {m.mtp_layers} layer(s)" if m.has_mtp else "no MTP head",
            f"MoE: {m.num_experts} experts" if m.moe else "dense",
        ]
        size = f", ~{m.params_estimate / 1e9:.1f}B params" if m.params_estimate else ""
        out.append(
            Finding(
                "info",
                "host",
                f"model {', '.join(m.architectures) or '?'}{size}",
                "; ".join(traits) + ("; " + "; ".join(m.notes) if m.notes else ""),
                "",
                "host.model",
            )
        )
    return out
