"""The simulator's command line: SGLang's flag set for the emulated version, plus `--sim-*` flags.

The emulated parser is built from the engine's generated flag catalogue, so every real flag of
that release is accepted and anything else exits 2 with argparse's own `usage:` + `error:` text
under SGLang's program name (`sglang serve`). The `--sim-*` flags are taken off first by a
separate parser, so they never show up in the emulated usage or errors.

Long because: the emulated SGLang parser, the --sim-* parser, the --config file expansion and the
resolution into SimConfig are one command line, read in the order SGLang reads it; the flag set
itself comes from the generated catalogue.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from sglang_supervisor.engine.sglang import FlagCatalog, flag_catalog
from sglang_supervisor.simulator import faults as faultmod
from sglang_supervisor.simulator import throughput, versions

PROG = "sglang serve"
_INT_FLAGS = {
    "--tp-size",
    "--tensor-parallel-size",
    "--dp-size",
    "--data-parallel-size",
    "--port",
    "--max-running-requests",
    "--context-length",
    "--max-total-tokens",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--chunked-prefill-size",
    "--decode-log-interval",
    "--max-prefill-tokens",
    "--cuda-graph-max-bs-decode",
    "--nnodes",
    "--node-rank",
    "--dist-timeout",
}
_FLOAT_FLAGS = {"--mem-fraction-static", "--watchdog-timeout"}
_SPEC_DEFAULTS = {
    "EAGLE": (3, 1, 4),
    "EAGLE3": (3, 1, 4),
    "NEXTN": (3, 1, 4),
    "STANDALONE": (3, 1, 4),
    "NGRAM": (0, 1, 8),
}
_HYBRID_MARKERS = ("qwen3.5", "qwen3.6", "qwen3_5", "qwen3-next", "qwen3_next")


class SimArgsError(ValueError):
    """Bad `--sim-*` input or environment; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class SimOptions:
    version: str
    faults: tuple[faultmod.Fault, ...]
    model_gb: float | None
    decode_tps: float | None
    gpu_gb: float
    time_scale: float
    entrypoint: str
    gpu_sm: float | None = None  # compute capability (9.0: H100/H200); None: no arch-specific refusals


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything the simulator needs, resolved from argv + environment. Pure data."""

    spec: versions.VersionSpec
    sim: SimOptions
    argv: tuple[str, ...]
    server_args: dict[str, Any]  # argparse dest -> value, as SGLang dumps it (api_key included)
    model_path: str
    served_model_name: str
    host: str
    port: int
    tp_size: int
    api_key: str | None
    enable_metrics: bool
    decode_backend: str  # full | breakable | disabled
    prefill_backend: str  # breakable | full | tc_piecewise | piecewise (legacy) | disabled
    prefill_disabled_reason: str
    spec_algorithm: str | None
    spec_steps: int
    spec_topk: int
    spec_draft_tokens: int
    has_draft_model: bool
    max_running_requests: int
    max_running_reset: bool  # "Max running requests is reset to 48 for speculative decoding"
    context_len: int
    mem_fraction_static: float
    max_total_tokens_flag: int | None
    chunked_prefill_size: int
    watchdog_timeout: float
    decode_log_interval: int
    language_only: bool
    hybrid: bool
    model_gb: float
    model_class: str
    deprecated: tuple[tuple[str, str | None], ...] = ()
    profile: throughput.Profile = field(default_factory=lambda: throughput.Profile(1.0))
    # --log-requests: echo every request into the log as SGLang does (simulator/reqlog.py)
    log_requests: bool = False
    log_requests_level: int = 2
    log_requests_format: str = "text"
    # Multi-node (simulator/multinode.py): this node's rank of `nnodes`, the leader's store address
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    dist_timeout: float | None = None

    @property
    def decode_graph(self) -> bool:
        return self.decode_backend != "disabled"

    @property
    def speculative(self) -> bool:
        return self.spec_algorithm is not None


def sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    g = p.add_argument_group("simulator options (sglang-sim only; SGLang itself has none of these)")
    g.add_argument(
        "--sim-version",
        default=None,
        help="SGLang release to emulate (default $SGLANG_SIM_VERSION or "
        f"{versions.DEFAULT_VERSION}; 'legacy' = 0.5.13)",
    )
    g.add_argument(
        "--sim-fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault (repeatable; grammar below; also $SGLANG_SIM_FAULTS)",
    )
    g.add_argument(
        "--sim-model-gb",
        type=float,
        default=None,
        help="weight size in GB (default: guessed from the model path, e.g. 27B -> 54)",
    )
    g.add_argument(
        "--sim-decode-tps",
        type=float,
        default=None,
        help="single-stream decode tok/s with CUDA graphs and no speculative decoding "
        "(default $SGLANG_SIM_DECODE_TPS or derived from model size and --tp-size)",
    )
    g.add_argument(
        "--sim-gpu-gb",
        type=float,
        default=None,
        help="memory per simulated GPU in GB (default $SGLANG_SIM_GPU_GB or 95)",
    )
    g.add_argument(
        "--sim-gpu-sm",
        type=float,
        default=None,
        help="compute capability of the simulated GPU, e.g. 9.0 for H100/H200 (default "
        "$SGLANG_SIM_GPU_SM or unset: no architecture-specific refusals). On 9.x "
        "--enable-single-batch-overlap fails at scheduler start as real 0.5.17 does",
    )
    g.add_argument(
        "--sim-time-scale",
        type=float,
        default=None,
        help="multiply simulated durations (default $SGLANG_SIM_TIME_SCALE or 1); token "
        "pacing is never scaled",
    )
    g.add_argument(
        "--sim-entrypoint",
        choices=("serve", "launch_server"),
        default="serve",
        help="launch_server prints the 'sglang serve is recommended' warning first",
    )
    return p


def build_parser(catalog: FlagCatalog) -> argparse.ArgumentParser:
    """argparse for the emulated release: every catalogue flag, SGLang's program name."""
    p = argparse.ArgumentParser(prog=PROG, allow_abbrev=catalog.allow_abbrev)
    # --model-path first, as in SGLang's usage line; the catalogue holds the rest sorted by name
    ordered = sorted(catalog.options.items(), key=lambda item: item[0] != "--model-path")
    for opt, flag in ordered:
        if opt in ("-h", "--help") or not opt.startswith("--"):
            continue
        dest = opt[2:].replace("-", "_")
        if not flag.takes_value:
            p.add_argument(opt, dest=dest, action="store_true")
            continue
        kwargs: dict[str, Any] = {"dest": dest, "metavar": dest.upper(), "default": None}
        if flag.nargs not in (None, "None"):
            kwargs["nargs"] = int(flag.nargs) if str(flag.nargs).isdigit() else flag.nargs
        if flag.choices is not None:
            kwargs["choices"] = list(flag.choices)
            kwargs.pop("metavar")
        # The catalogue's converter (recorded from the wheel), as the real parser has it.
        if flag.value_type == "int" or opt in _INT_FLAGS:
            kwargs["type"] = int
        elif flag.value_type == "float" or opt in _FLOAT_FLAGS:
            kwargs["type"] = float
        if "type" in kwargs and "choices" in kwargs:  # argparse compares converted values
            kwargs["choices"] = [kwargs["type"](c) for c in kwargs["choices"]]
        if opt == "--model-path":
            kwargs["required"] = True
        p.add_argument(opt, **kwargs)
    return p


def _env_float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise SimArgsError(f"{name}={raw!r} is not a number; set it like {name}=0.05") from None
    if not math.isfinite(value) or value <= 0:
        raise SimArgsError(f"{name}={raw!r} must be a positive number")
    return value


def parse_sim_options(argv: Sequence[str], env: Mapping[str, str]) -> tuple[SimOptions, list[str]]:
    """Split off the `--sim-*` flags; raises SimArgsError on bad values (faults included)."""
    ns, rest = sim_parser().parse_known_args(list(argv))
    version = ns.sim_version or env.get("SGLANG_SIM_VERSION") or versions.DEFAULT_VERSION
    specs = faultmod.split_env(env.get("SGLANG_SIM_FAULTS", "")) + list(ns.sim_fault)
    try:
        parsed = faultmod.parse_faults(specs)
    except faultmod.FaultSpecError as exc:
        raise SimArgsError(str(exc)) from None
    scale = ns.sim_time_scale if ns.sim_time_scale is not None else _env_float(env, "SGLANG_SIM_TIME_SCALE")
    tps = ns.sim_decode_tps if ns.sim_decode_tps is not None else _env_float(env, "SGLANG_SIM_DECODE_TPS")
    gpu = ns.sim_gpu_gb if ns.sim_gpu_gb is not None else _env_float(env, "SGLANG_SIM_GPU_GB")
    sm = ns.sim_gpu_sm if ns.sim_gpu_sm is not None else _env_float(env, "SGLANG_SIM_GPU_SM")
    for name, val in (
        ("--sim-time-scale", scale),
        ("--sim-decode-tps", tps),
        ("--sim-model-gb", ns.sim_model_gb),
        ("--sim-gpu-gb", gpu),
        ("--sim-gpu-sm", sm),
    ):
        if val is not None and (not math.isfinite(val) or val <= 0):
            raise SimArgsError(f"{name} must be a positive number, got {val}")
    opts = SimOptions(
        version=version,
        faults=parsed,
        model_gb=ns.sim_model_gb,
        decode_tps=tps,
        gpu_gb=gpu or 95.0,
        time_scale=scale or 1.0,
        entrypoint=ns.sim_entrypoint,
        gpu_sm=sm,
    )
    return opts, rest


def expand_config_file(argv: list[str]) -> list[str]:
    """`--config FILE.yaml`: the file's keys become flags placed before the command line's
    (so the command line wins), like SGLang's own config loader."""
    out: list[str] = []
    i = 0
    pre: list[str] = []
    while i < len(argv):
        tok = argv[i]
        path: str | None = None
        if tok == "--config" and i + 1 < len(argv):
            path, i = argv[i + 1], i + 2
        elif tok.startswith("--config="):
            path, i = tok.split("=", 1)[1], i + 1
        else:
            out.append(tok)
            i += 1
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SimArgsError(f"--config {path}: cannot read it ({exc})") from None
        if not isinstance(data, dict):
            raise SimArgsError(f"--config {path}: expected a mapping of flag names to values")
        for key, value in data.items():
            flag = "--" + str(key).replace("_", "-")
            if value is True:
                pre.append(flag)
            elif value is False or value is None:
                continue
            elif isinstance(value, list):
                pre.extend([flag, *map(str, value)])
            else:
                pre.extend([flag, str(value)])
    return pre + out


def _model_class(model_path: str) -> str:
    low = model_path.lower()
    if any(m in low for m in ("qwen3.5", "qwen3.6", "qwen3_5")):
        return "Qwen3_5ForConditionalGeneration"
    if "llama" in low:
        return "LlamaForCausalLM"
    if "qwen2" in low:
        return "Qwen2ForCausalLM"
    return "Qwen3ForCausalLM"


def _graph_backends(ns: argparse.Namespace, spec: versions.VersionSpec) -> tuple[str, str, str]:
    """(decode backend, prefill backend, why prefill is disabled), per version semantics."""
    get = vars(ns).get
    if spec.capture_style == "legacy":
        decode = "disabled" if get("disable_cuda_graph") else "full"
        piecewise = bool(get("enforce_piecewise_cuda_graph")) and not get("disable_piecewise_cuda_graph")
        return decode, ("piecewise" if piecewise and decode != "disabled" else "disabled"), ""
    decode = get("cuda_graph_backend_decode") or "full"
    prefill = get("cuda_graph_backend_prefill") or spec.prefill_default
    if get("enforce_piecewise_cuda_graph") and not get("cuda_graph_backend_prefill"):
        prefill = "tc_piecewise"
    if get("disable_piecewise_cuda_graph"):
        prefill = "disabled"
    if get("disable_cuda_graph"):
        decode = prefill = "disabled"
    reason = ""
    if prefill == "disabled":
        reason = (
            "cuda_graph_config resolved prefill.backend='disabled' (e.g. via "
            "--cuda-graph-backend-prefill=disabled or auto-disable rules)."
        )
    return decode, prefill, reason


def resolve(
    argv: Sequence[str],
    ns: argparse.Namespace,
    sim: SimOptions,
    spec: versions.VersionSpec,
    catalog: FlagCatalog,
) -> SimConfig:
    """Turn parsed flags into the simulated engine's settings (pure).

    Long because: it derives every setting SGLang derives at start-up (the tp and node checks,
    speculative defaults, max running requests, context length, the resolved server_args, the
    deprecated aliases given) and builds the throughput profile and SimConfig from them, one
    constructor each; the derived values feed both, field by field.
    """
    get = vars(ns).get
    model_path: str = ns.model_path
    tp = int(get("tp_size") or get("tensor_parallel_size") or 1)
    if tp < 1:
        raise SimArgsError(f"--tp-size must be >= 1, got {tp}")
    nnodes = int(get("nnodes") or 1)
    node_rank = int(get("node_rank") or 0)
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise SimArgsError(f"--node-rank {node_rank} must be in 0..{nnodes - 1} (--nnodes {nnodes})")
    if nnodes > 1 and tp % nnodes:
        raise SimArgsError(f"--tp-size {tp} must be a multiple of --nnodes {nnodes}: ranks are "
                           "split evenly over the nodes")
    if nnodes > 1 and not get("dist_init_addr"):
        raise SimArgsError("--nnodes > 1 needs --dist-init-addr HOST:PORT (the leader's address)")
    algo_raw = get("speculative_algorithm")
    algo = None if algo_raw in (None, "", "None") else str(algo_raw).upper()
    steps = topk = draft = 0
    if algo is not None:
        d_steps, d_topk, d_draft = _SPEC_DEFAULTS.get(algo, (3, 1, 4))
        steps = int(get("speculative_num_steps") or d_steps)
        topk = int(get("speculative_eagle_topk") or d_topk)
        draft = int(get("speculative_num_draft_tokens") or d_draft)
    decode, prefill, reason = _graph_backends(ns, spec)
    flag_mrr = get("max_running_requests")
    reset = algo is not None and flag_mrr is None
    mrr = int(flag_mrr) if flag_mrr is not None else (48 if algo is not None else 4096)
    model_gb = sim.model_gb or throughput.model_gb_from_path(model_path)
    hybrid = any(m in model_path.lower() for m in _HYBRID_MARKERS)
    context = int(get("context_length") or (262144 if hybrid else 32768 if model_gb > 4 else 4096))
    server_args = {k: v for k, v in vars(ns).items()}
    server_args["tp_size"] = tp
    server_args["tokenizer_path"] = get("tokenizer_path") or model_path
    server_args["served_model_name"] = get("served_model_name") or model_path
    server_args["host"] = get("host") or "127.0.0.1"
    port_flag = get("port")
    server_args["port"] = 30000 if port_flag is None else int(port_flag)
    deprecated = tuple(
        (opt, flag.deprecated_to)
        for opt, flag in catalog.options.items()
        if flag.deprecated and _given(argv, opt)
    )
    profile = throughput.Profile(
        model_gb=model_gb,
        tp_size=tp,
        decode_graph=decode != "disabled",
        prefill_graph=prefill != "disabled",
        spec_steps=(max(steps, 1) if algo is not None else 0),
        spec_draft_tokens=draft,
        spec_topk=topk,
        max_running_requests=mrr,
        base_tps=sim.decode_tps,
    )
    return SimConfig(
        spec=spec,
        sim=sim,
        argv=tuple(argv),
        server_args=server_args,
        model_path=model_path,
        served_model_name=server_args["served_model_name"],
        host=server_args["host"],
        port=server_args["port"],
        tp_size=tp,
        api_key=get("api_key"),
        enable_metrics=bool(get("enable_metrics")),
        decode_backend=decode,
        prefill_backend=prefill,
        prefill_disabled_reason=reason,
        spec_algorithm=algo,
        spec_steps=steps,
        spec_topk=topk,
        spec_draft_tokens=draft,
        has_draft_model=algo is not None and algo != "NGRAM",
        max_running_requests=mrr,
        max_running_reset=reset,
        context_len=context,
        mem_fraction_static=float(get("mem_fraction_static") or (0.88 if model_gb > 4 else 0.8)),
        max_total_tokens_flag=get("max_total_tokens"),
        chunked_prefill_size=int(get("chunked_prefill_size") or 8192),
        watchdog_timeout=float(get("watchdog_timeout") or 300.0),
        decode_log_interval=int(get("decode_log_interval") or 40),
        language_only=bool(get("language_only")),
        hybrid=hybrid,
        model_gb=model_gb,
        model_class=_model_class(model_path),
        deprecated=deprecated,
        profile=profile,
        log_requests=bool(get("log_requests")),
        log_requests_level=int(get("log_requests_level") or 2),
        log_requests_format=str(get("log_requests_format") or "text"),
        nnodes=nnodes,
        node_rank=node_rank,
        dist_init_addr=get("dist_init_addr"),
        dist_timeout=get("dist_timeout"),
    )


def _given(argv: Sequence[str], opt: str) -> bool:
    return any(tok == opt or tok.startswith(opt + "=") for tok in argv)


def catalog_for(spec: versions.VersionSpec) -> FlagCatalog:
    return flag_catalog(spec.version)


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> SimConfig:
    """argv -> SimConfig. argparse errors exit 2 (SystemExit); SimArgsError for sim flags."""
    sim, rest = parse_sim_options(argv, env)
    spec = versions.resolve(sim.version)
    rest = expand_config_file(rest)
    catalog = catalog_for(spec)
    ns = build_parser(catalog).parse_args(rest)
    cfg = resolve(rest, ns, sim, spec, catalog)
    for f in active_faults(cfg):
        if f.rank >= cfg.tp_size:
            raise SimArgsError(
                f"fault {f.kind} targets rank {f.rank} but --tp-size is {cfg.tp_size}; "
                f"use +rank=0..{cfg.tp_size - 1}"
            )
    return cfg


def active_faults(cfg: SimConfig) -> tuple[faultmod.Fault, ...]:
    return faultmod.active(cfg.sim.faults, cfg.argv)
