"""Communication between the TP ranks: NVLS, FlashInfer allreduce fusion, custom allreduce."""

from __future__ import annotations

from collections.abc import Sequence

from sglang_supervisor.core.audit.findings import Finding
from sglang_supervisor.core.gpufacts import GpuInfo, P2PLink
from sglang_supervisor.engine.argv import Flags, tp_of
from sglang_supervisor.engine.versions import SBO_REFUSED_ON_SM90, at_least


def _min_cc(gpus: Sequence[GpuInfo]) -> tuple[int, int] | None:
    ccs: list[tuple[int, int]] = []
    for g in gpus:
        if g.compute_capability:
            major, _, minor = g.compute_capability.partition(".")
            ccs.append((int(major), int(minor or 0)))
    return min(ccs) if ccs else None


def _tp_cc(flags: Flags, gpus: Sequence[GpuInfo]) -> tuple[int, tuple[int, int] | None]:
    """The TP size and the lowest compute capability among the GPUs it uses."""
    tp = tp_of(flags)
    return tp, _min_cc(list(gpus)[:tp])


def comm_findings(
    flags: Flags, gpus: Sequence[GpuInfo], link: P2PLink | None, profile: str
) -> list[Finding]:
    tp, cc = _tp_cc(flags, gpus)
    sm = f"SM{cc[0]}{cc[1]}" if cc else "unknown"
    out = _sm90_only(flags, cc, sm, profile)
    if tp <= 1:
        return out
    out += _sm90_available(flags, cc, sm, profile)
    out += _custom_allreduce(flags, link, profile)
    return out


def _sm90_only(flags: Flags, cc: tuple[int, int] | None, sm: str, profile: str) -> list[Finding]:
    """Flags that ask for what only SM90+ has."""
    out: list[Finding] = []
    if flags.on("--enable-nccl-nvls") and cc is not None and cc < (9, 0):
        out.append(
            Finding(
                "warning",
                "audit",
                f"--enable-nccl-nvls cannot work on these GPUs ({sm})",
                "NCCL NVLS (NVLink SHARP) needs SM90+ and NVSwitch",
                "remove --enable-nccl-nvls",
                "comm.nvls",
                profile,
            )
        )
    if flags.on("--enable-flashinfer-allreduce-fusion") and cc is not None and cc < (9, 0):
        out.append(
            Finding(
                "warning",
                "audit",
                f"--enable-flashinfer-allreduce-fusion has no effect on {sm}",
                "FlashInfer allreduce fusion needs SM90+",
                "remove --enable-flashinfer-allreduce-fusion",
                "comm.flashinfer_fusion",
                profile,
            )
        )
    return out


def _sm90_available(flags: Flags, cc: tuple[int, int] | None, sm: str, profile: str) -> list[Finding]:
    """What these GPUs offer a TP group beyond custom allreduce."""
    out: list[Finding] = []
    if cc is None:
        out.append(
            Finding(
                "info",
                "audit",
                "NVLS / FlashInfer allreduce fusion availability unknown",
                "no GPU facts (NVML unavailable): both need SM90+",
                "",
                "comm.unknown",
                profile,
            )
        )
    elif cc >= (9, 0):
        if not flags.on("--enable-nccl-nvls"):
            out.append(
                Finding(
                    "info",
                    "audit",
                    f"{sm}: NCCL NVLS is available to try",
                    "NVLink SHARP speeds up allreduce on NVSwitch systems",
                    "--enable-nccl-nvls (only with NVSwitch)",
                    "comm.nvls",
                    profile,
                )
            )
    else:
        out.append(
            Finding(
                "info",
                "audit",
                f"{sm}: no NVLS and no FlashInfer allreduce fusion here",
                "both need SM90+; custom allreduce is the fast path on these GPUs",
                "",
                "comm.sm",
                profile,
            )
        )
    return out


def _custom_allreduce(flags: Flags, link: P2PLink | None, profile: str) -> list[Finding]:
    """SGLang's custom allreduce needs peer-to-peer between the TP GPUs."""
    out: list[Finding] = []
    if flags.on("--disable-custom-all-reduce"):
        if link in ("nvlink", "pcie-p2p"):
            out.append(
                Finding(
                    "warning",
                    "audit",
                    "--disable-custom-all-reduce leaves performance on the table",
                    f"the TP GPUs are linked by {link}: SGLang's custom allreduce beats NCCL for small "
                    "decode messages",
                    "remove --disable-custom-all-reduce",
                    "comm.custom_ar",
                    profile,
                )
            )
    elif link == "none":
        out.append(
            Finding(
                "info",
                "audit",
                "custom allreduce cannot use peer-to-peer here",
                "no NVLink or PCIe P2P between the TP GPUs: SGLang falls back to NCCL",
                "",
                "comm.custom_ar",
                profile,
            )
        )
    elif link in ("nvlink", "pcie-p2p"):
        out.append(
            Finding(
                "ok",
                "audit",
                f"custom allreduce over {link}",
                "TP GPUs can talk peer-to-peer",
                "",
                "comm.custom_ar",
                profile,
            )
        )
    return out


def sbo_refusal_findings(flags: Flags, gpus: Sequence[GpuInfo], version: str,
                         profile: str) -> list[Finding]:
    """SGLang refuses single batch overlap on SM 9.x at scheduler start, before any weight loads:
    the profile cannot start on these GPUs (the daemon then classifies it `flag_refused`)."""
    if not flags.on("--enable-single-batch-overlap") or not at_least(version, SBO_REFUSED_ON_SM90):
        return []
    _, cc = _tp_cc(flags, gpus)
    if cc is None or cc[0] != 9:
        return []
    return [
        Finding(
            "error",
            "audit",
            f"SGLang {version} refuses --enable-single-batch-overlap on these GPUs (SM{cc[0]}{cc[1]})",
            f"from {SBO_REFUSED_ON_SM90} SGLang's scheduler raises a ValueError for it on any SM 9.x "
            "GPU, for every model, before any weight loads: this profile cannot start here",
            "remove --enable-single-batch-overlap from this profile on SM 9.x machines",
            "comm.sbo_sm90",
            profile,
        )
    ]
