"""audit: pure doctor rules, one behaviour per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedargs import NEXTN_SPEC
from sglang_supervisor.core import audit
from sglang_supervisor.core.audit import Finding, HostFacts, ProfileView
from sglang_supervisor.engine.argv import parse_flags
from sglang_supervisor.engine.graphs import graph_phases
from sglang_supervisor.engine.modelinfo import parse_model_config, read_model_dir
from sglang_supervisor.engine.sglang import FlagProblem, Migration, flag_catalog
from sglang_supervisor.shell.telemetry.gpu import GpuInfo

QWEN = read_model_dir(Path(__file__).resolve().parents[3] / "fixtures" / "models" / "qwen3.6-27b-like")
DENSE_VLM_NOT_ALLOWED = parse_model_config(
    {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "vision_config": {}, "num_hidden_layers": 4}
)
MOE = parse_model_config(
    {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128, "num_hidden_layers": 4}
)


def codes(findings: list[Finding], severity: str | None = None) -> set[str]:
    return {f.code for f in findings if severity is None or f.severity == severity}


def run(args: list[str], version: str = "0.5.23", model=QWEN, env=None, **kw) -> list[Finding]:  # type: ignore[no-untyped-def]
    return audit.audit_profile(ProfileView("p", tuple(args), env or {}), version, model, **kw)


def gpu(cc: str, index: int = 0) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index}",
        name="RTX A6000",
        compute_capability=cc,
        driver="580",
        memory_used_bytes=0,
        memory_total_bytes=48 * 2**30,
        utilization_ratio=None,
        temperature_c=None,
        temperature_slowdown_c=None,
        power_w=None,
        power_limit_w=None,
        sm_clock_hz=None,
        throttle_reasons=(),
        processes=(),
    )


# ---- argv view --------------------------------------------------------------------------------


def test_parse_flags_expands_abbreviations_with_a_catalogue() -> None:
    flags = parse_flags(["--tp", "2", "--mem-frac=0.8", "--trust-remote-code"], flag_catalog("0.5.23"))
    assert flags.int("--tp-size") == 2
    assert flags.get("--mem-fraction-static") == "0.8"
    assert flags.on("--trust-remote-code")
    assert not flags.on("--language-only")


# ---- CUDA graph phases ------------------------------------------------------------------------


def test_defaults_on_0523_qwen36_both_graphs_on_thanks_to_allow_list() -> None:
    decode, prefill = graph_phases(parse_flags([]), "0.5.23", QWEN)
    assert decode.on and decode.backend == "full"
    assert prefill.on and prefill.backend == "breakable"
    assert any("allow-list" in r for r in prefill.reasons)


def test_multimodal_arch_off_the_allow_list_loses_the_prefill_graph() -> None:
    _, prefill = graph_phases(parse_flags([]), "0.5.23", DENSE_VLM_NOT_ALLOWED)
    assert not prefill.on
    assert any("multimodal" in r for r in prefill.reasons)
    assert "--cuda-graph-backend-prefill breakable" in prefill.fix


def test_explicit_prefill_backend_skips_auto_rules_but_not_kv_sharding() -> None:
    _, locked = graph_phases(
        parse_flags(["--cuda-graph-backend-prefill", "breakable"]), "0.5.23", DENSE_VLM_NOT_ALLOWED
    )
    assert locked.on
    _, sharded = graph_phases(
        parse_flags(["--cuda-graph-backend-prefill", "breakable", "--enable-kv-cache-sharding"]),
        "0.5.23",
        QWEN,
    )
    assert not sharded.on


def test_pp_and_lora() -> None:
    _, pp = graph_phases(parse_flags(["--pp-size", "2"]), "0.5.23", QWEN)
    assert not pp.on and "pipeline" in pp.reasons[0]
    _, lora = graph_phases(parse_flags(["--enable-lora"]), "0.5.23", QWEN)
    assert lora.on and not lora.certain


def test_disable_cuda_graph_turns_both_phases_off() -> None:
    decode, prefill = graph_phases(parse_flags(["--disable-cuda-graph"]), "0.5.23", QWEN)
    assert not decode.on and not prefill.on
    assert "graph.decode.off" in codes(run(["--disable-cuda-graph"]), "warning")


def test_legacy_0513_multimodal_rule_and_enforce() -> None:
    _, prefill = graph_phases(parse_flags([]), "0.5.13", QWEN)
    assert not prefill.on and any("multimodal" in r for r in prefill.reasons)
    _, forced = graph_phases(parse_flags(["--enforce-piecewise-cuda-graph"]), "0.5.13", QWEN)
    assert forced.on and forced.backend == "piecewise"
    _, torch_compile = graph_phases(
        parse_flags(["--enable-torch-compile"]),
        "0.5.13",
        parse_model_config({"architectures": ["LlamaForCausalLM"]}),
    )
    assert not torch_compile.on


def test_tc_piecewise_is_gone_on_0522() -> None:
    _, prefill = graph_phases(parse_flags(["--cuda-graph-backend-prefill", "tc_piecewise"]), "0.5.22", QWEN)
    assert not prefill.on and "breakable" in prefill.fix


# ---- speculative decoding ---------------------------------------------------------------------


def test_mtp_is_not_an_algorithm_and_the_fix_names_nextn() -> None:
    f = [x for x in run(["--speculative-algorithm", "MTP"]) if x.code == "spec.unknown_algorithm"]
    assert f and f[0].severity == "error"
    assert "Unknown speculative algorithm name: MTP" in f[0].why
    assert "NEXTN" in f[0].fix


def test_nextn_is_an_alias_and_needs_an_mtp_head_or_a_draft() -> None:
    args = [*NEXTN_SPEC]
    got = run(args)
    assert {"spec.nextn_alias", "spec.ok"} <= codes(got)
    no_head = parse_model_config({"architectures": ["LlamaForCausalLM"]})
    assert "spec.no_draft" in codes(run(args, model=no_head), "error")
    assert "spec.no_draft" not in codes(run([*args, "--speculative-draft-model-path", "/d"], model=no_head))


def eagle(steps: int, topk: int, draft_tokens: int) -> list[str]:
    return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft_tokens)]


def test_steps_topk_draft_tokens_consistency() -> None:
    chain = run(eagle(steps=3, topk=1, draft_tokens=8))
    f = next(x for x in chain if x.code == "spec.draft_tokens")
    assert f.severity == "warning" and "--speculative-num-draft-tokens 4" in f.fix
    tree = run(eagle(steps=2, topk=2, draft_tokens=9))
    assert "spec.draft_tokens" in codes(tree, "warning")
    ok_tree = run(eagle(steps=2, topk=2, draft_tokens=5))
    assert "spec.draft_tokens" not in codes(ok_tree)


def test_unused_mtp_head_is_pointed_out() -> None:
    assert "spec.mtp_unused" in codes(run([]), "info")


# ---- the seed's three "performance" flags and the env ----------------------------------------


def test_language_only_explains_disaggregation_and_the_port() -> None:
    f = next(
        x for x in run(["--language-only", "--encoder-bootstrap-port", "9100"]) if x.code == "language_only"
    )
    assert f.severity == "warning"
    assert "9100" in f.what and "encoder" in f.why and "not a 'text-only' switch" in f.why


def test_single_batch_overlap_is_moe_only() -> None:
    dense = next(x for x in run(["--enable-single-batch-overlap"]) if x.code == "single_batch_overlap")
    assert dense.severity == "warning" and "dense" in dense.what
    moe = next(
        x for x in run(["--enable-single-batch-overlap"], model=MOE) if x.code == "single_batch_overlap"
    )
    assert moe.severity == "ok"


def test_spec_v2_env_by_version() -> None:
    env = {"SGLANG_ENABLE_SPEC_V2": "1"}
    new = next(x for x in run([], env=env) if x.code == "env.spec_v2")
    assert new.severity == "warning" and "does nothing" in new.what
    mid = next(x for x in run([], "0.5.17", env=env) if x.code == "env.spec_v2")
    assert "removed" in mid.what
    old = next(x for x in run([], "0.5.13", env=env) if x.code == "env.spec_v2")
    assert old.severity == "info"


# ---- hardware ---------------------------------------------------------------------------------


def test_nvls_and_fusion_need_sm90() -> None:
    a6000 = [gpu("8.6", 0), gpu("8.6", 1)]
    got = run(["--tp-size", "2", "--enable-nccl-nvls", "--enable-flashinfer-allreduce-fusion"], gpus=a6000)
    assert {"comm.nvls", "comm.flashinfer_fusion"} <= codes(got, "warning")
    h200 = [gpu("9.0", 0), gpu("9.0", 1)]
    assert "comm.nvls" in codes(run(["--tp-size", "2"], gpus=h200), "info")



@pytest.mark.parametrize(("cc", "version", "refused"), [
    ("9.0", "0.5.17", True),  # the H200 of tests/fixtures/sglang-0.5.17-h200-seed
    ("9.0", "0.5.13", True),  # the first release with the check (0.5.12's moe/utils.py has none)
    ("9.0", "0.5.12", False),
    ("8.6", "0.5.23", False),  # the seed's RTX A6000
    ("10.0", "0.5.23", False),  # the check is for major 9 only
])
def test_single_batch_overlap_on_sm90_is_an_error_from_0513(cc: str, version: str,
                                                            refused: bool) -> None:
    got = run(["--tp-size", "2", "--enable-single-batch-overlap"], version,
              gpus=[gpu(cc, 0), gpu(cc, 1)])
    assert ("comm.sbo_sm90" in codes(got, "error")) is refused
    assert "comm.sbo_sm90" not in codes(run(["--tp-size", "2"], version,
                                            gpus=[gpu(cc, 0), gpu(cc, 1)]))


def test_single_batch_overlap_without_gpu_facts_is_not_called_refused() -> None:
    assert "comm.sbo_sm90" not in codes(run(["--enable-single-batch-overlap"], "0.5.23"))

@pytest.mark.parametrize("tp_flag", ["--tp-size", "--tp", "--tensor-parallel-size"])  # argparse aliases
def test_custom_allreduce_disabled_over_nvlink_is_a_warning(tp_flag: str) -> None:
    got = run(
        [tp_flag, "2", "--disable-custom-all-reduce"], gpus=[gpu("8.6", 0), gpu("8.6", 1)], link="nvlink"
    )
    assert "comm.custom_ar" in codes(got, "warning")


def test_host_without_nvml_says_so_and_continues() -> None:
    got = audit.host_findings(HostFacts(nvml=False, model=QWEN, ports_checked={30000: "engine"}), 2)
    assert "host.nvml" in codes(got, "warning")
    assert "host.model" in codes(got, "info") and "host.port" in codes(got, "ok")
    assert not audit.has_errors(got)


def test_host_errors_gpu_count_busy_port_and_too_small_gpus() -> None:
    facts = HostFacts(
        nvml=True,
        gpus=(gpu("8.6"),),
        ports_busy={8997: "encoder bootstrap"},
        ports_checked={8997: "encoder bootstrap"},
        model=QWEN,
    )
    got = audit.host_findings(facts, 2, 0.88)
    assert {"host.gpu_count", "host.port"} <= codes(got, "error")
    one_big = audit.host_findings(HostFacts(nvml=True, gpus=(gpu("8.6"),), model=QWEN), 1, 0.88)
    assert "host.memory" in codes(one_big, "error")  # 55 GB of bf16 weights on one 48 GiB card


# ---- catalogue, migrations, parser ------------------------------------------------------------


def test_migrations_name_old_and_new_flag() -> None:
    got = audit.migration_findings(
        "tuned",
        "0.5.23",
        [
            Migration(
                "--mamba-scheduler-strategy extra_buffer",
                "--mamba-radix-cache-strategy extra_buffer",
                "0.5.14",
                "renamed",
            )
        ],
    )
    assert got[0].severity == "warning"
    assert "--mamba-scheduler-strategy" in got[0].what and "--mamba-radix-cache-strategy" in got[0].fix


def test_catalog_errors_and_ok() -> None:
    bad = audit.catalog_findings("p", "0.5.23", [FlagProblem("--bogus", "error", "unknown", "remove it")])
    assert audit.has_errors(bad)
    assert codes(audit.catalog_findings("p", "0.5.23", [])) == {"flag.catalog_ok"}


def test_parser_findings() -> None:
    got = audit.parser_findings(
        "p",
        {
            "unknown": ["--enforce-piecewise-cuda-graph"],
            "error": None,
            "abbreviations": {"--tp": "--tp-size"},
        },
        "0.5.23",
    )
    assert "parser.unknown" in codes(got, "error") and "parser.abbreviation" in codes(got, "warning")
    assert codes(audit.parser_findings("p", {"unknown": [], "error": None}, "0.5.23")) == {"parser.ok"}


def test_collapse_common_and_order() -> None:
    a = Finding("warning", "engine", "same", "w", "f", "x", "a")
    b = Finding("warning", "engine", "same", "w", "f", "x", "b")
    c = Finding("ok", "engine", "only b", "", "", "y", "b")
    got = audit.collapse_common([a, c, b], ["a", "b"])
    assert [(f.profile, f.code) for f in got] == [(None, "x"), ("b", "y")]
    order = audit.sort_findings([c, Finding("error", "host", "h", "", "", "z")])
    assert [f.area for f in order] == ["host", "engine"]


# ---- live -------------------------------------------------------------------------------------


def test_live_evidence_and_redaction() -> None:
    info = {
        "version": "0.5.23",
        "model_path": "/m",
        "api_key": "sk-secret",
        "speculative_algorithm": None,
        "cuda_graph_backend_decode": "disabled",
        "internal_states": [{"last_gen_throughput": 35.5, "memory_usage": {"graph": {"decode": 0.0}}}],
    }
    got = audit.live_findings(info, decode_none_passes=12)
    assert {"live.decode_eager", "live.decode_none"} <= codes(got, "warning")
    assert "35.5 tok/s" in next(f.what for f in got if f.code == "live.summary")
    assert audit.redact_server_info(info)["api_key"] == "<redacted>"
    spec = {
        "speculative_algorithm": "EAGLE",
        "internal_states": [
            {"avg_spec_accept_length": 1.1, "memory_usage": {"graph": {"target_verify": 0.3}}}
        ],
    }
    assert "live.spec_accept" in codes(audit.live_findings(spec), "warning")
    assert "live.decode_graph" in codes(audit.live_findings(spec), "ok")


def test_busy_port_held_by_a_running_engine_is_info_and_a_foreign_one_an_error() -> None:
    facts = HostFacts(
        nvml=True,
        gpus=(gpu("9.0"),),
        ports_busy={30000: "engine HTTP", 9100: "supervisor metrics"},
        ports_running={30000: "SGLang already running (pid 42, the configured model, started by "
                              "sglang-supervisor pid 41)"},
        ports_checked={30000: "engine HTTP", 9100: "supervisor metrics"},
    )
    got = audit.host_findings(facts, 1)
    running = [f for f in got if f.code == "host.port_running"]
    assert [f.severity for f in running] == ["info"]
    assert "30000" in running[0].what and "pid 42" in running[0].what
    busy = [f for f in got if f.code == "host.port"]
    assert [(f.severity, "9100" in f.what) for f in busy] == [("error", True)]
