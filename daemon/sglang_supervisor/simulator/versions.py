"""What differs between the SGLang releases the simulator emulates: data, one entry per version.

Flag sets come from the engine's generated catalogues (`engine.sglang.flag_catalog`); this table
holds the behaviour: log wording, routes, exit codes. Adding a version is adding a row (or
letting a newer catalogue fall back to the nearest row at or below it).
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_supervisor.engine.sglang import known_versions, nearest_known_version, parse_version

DEFAULT_VERSION = "0.5.23"
ALIASES = {"legacy": "0.5.13", "latest": DEFAULT_VERSION}

DECODE_FAIL_HINT = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
LEGACY_DECODE_FAIL_HINT = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
PREFILL_FAIL_HINT_TC = (
    "Fail when using backend: breakable for prefill runner.\n"
    "Possible suggestions:\n"
    "1. change to tc_piecewise by --cuda-graph-backend-prefill=tc_piecewise\n"
    "2. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled\n"
    "3. if it is an OOM problem, set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7) "
    "or set --cuda-graph-max-bs-prefill to a smaller value (e.g., 2048)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
PREFILL_FAIL_HINT = (
    "Fail when using backend: breakable for prefill runner.\n"
    "Possible suggestions:\n"
    "1. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled\n"
    "2. if it is an OOM problem, set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7) "
    "or set --cuda-graph-max-bs-prefill to a smaller value (e.g., 2048)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
LEGACY_PIECEWISE_FAIL_HINT = (
    "Piecewise CUDA Graph failed with error: {error}\n"
    "Piecewise CUDA Graph is enabled by default as an experimental feature.\n"
    "To work around this error, add --disable-piecewise-cuda-graph to your launch command.\n"
    "Please report this issue at https://github.com/sgl-project/sglang/issues/new/choose\n"
)


@dataclass(frozen=True, slots=True)
class VersionSpec:
    version: str
    capture_style: str  # "modern": `Capture target decode CUDA graph begin.`; "legacy": ≤0.5.13
    server_args_style: str  # "dict": `server_args={...}`; "dataclass": `server_args=ServerArgs(...)`
    init_style: str  # "parallel": `Init parallel begin.`; "torch": `Init torch distributed begin.`
    prefill_progress: str  # tqdm description of the prefill capture bar
    weight_progress: str
    prefill_default: str  # prefill graph backend when no flag says otherwise
    has_ready_route: bool
    clean_exit_code: int  # after a graceful SIGTERM drain
    kv_oom_style: str  # "value_error" (0.5.17 wording) or "runtime_error"
    prefill_hint: str
    decode_hint: str
    startup_timings_line: bool
    # 0.5.14: an EAGLE-family target on a prefill backend other than breakable logs why it has no
    # prefill graph instead of capturing one (model_runner.init_prefill_cuda_graph, #28386)
    eagle_target_prefill_skip: bool


def _at_least(version: str, floor: str) -> bool:
    return parse_version(version) >= parse_version(floor)


def _build(version: str) -> VersionSpec:
    modern = _at_least(version, "0.5.14")
    newer = _at_least(version, "0.5.20")
    return VersionSpec(
        version=version,
        capture_style="modern" if modern else "legacy",
        server_args_style="dict" if newer else "dataclass",
        init_style="parallel" if newer else "torch",
        prefill_progress="Capturing prefill shape" if newer else "Capturing num tokens",
        weight_progress="Multi-thread loading shards"
        if modern and not newer
        else "Loading safetensors checkpoint shards",
        # 0.5.14's default is the torch.compile piecewise graph (engine/graphs); <=0.5.13 has no
        # per-phase backend (capture_style "legacy" decides there)
        prefill_default="breakable" if _at_least(version, "0.5.15") else "tc_piecewise",
        has_ready_route=newer,
        clean_exit_code=0 if _at_least(version, "0.5.19") else -9,
        kv_oom_style="value_error" if _at_least(version, "0.5.17") and not newer else "runtime_error",
        prefill_hint=PREFILL_FAIL_HINT if _at_least(version, "0.5.22") else PREFILL_FAIL_HINT_TC,
        decode_hint=DECODE_FAIL_HINT if modern else LEGACY_DECODE_FAIL_HINT,
        startup_timings_line=_at_least(version, "0.5.17"),
        eagle_target_prefill_skip=modern and not _at_least(version, "0.5.15"),
    )


class UnknownVersionError(ValueError):
    pass


def resolve(version: str) -> VersionSpec:
    """The behaviour row for `version` ("legacy" = 0.5.13). Unknown newer releases use the
    nearest older row; versions older than the oldest catalogue are refused."""
    name = ALIASES.get(version.strip().lower(), version.strip())
    try:
        parsed = parse_version(name)
    except ValueError:
        raise UnknownVersionError(
            f"--sim-version {version!r} is not a version; use one of {', '.join(known_versions())} "
            "or 'legacy'"
        ) from None
    if parsed < parse_version(known_versions()[0]):
        raise UnknownVersionError(
            f"--sim-version {version!r} is older than any emulated release; use "
            f"{', '.join(known_versions())} or 'legacy'"
        )
    use = name if name in known_versions() else nearest_known_version(name)
    return _build(use)
