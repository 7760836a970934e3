"""engine/graphs: which CUDA graphs a command captures, on which rank, per SGLang version.

One table for the READY gate (`expected_captures`), and a check that the doctor's verdicts
(`graph_phases`) say the same thing for every row and version: the daemon never waits for a
graph that doctor calls off, nor ignores one that doctor calls on.
"""

from __future__ import annotations

import pytest

from sglang_supervisor.commands.doctor import Report, format_human
from sglang_supervisor.core.audit import ProfileView, audit_profile
from sglang_supervisor.engine.argv import parse_flags
from sglang_supervisor.engine.graphs import expected_captures, graph_phases
from sglang_supervisor.engine.modelinfo import parse_model_config

T2 = ("TP0", "TP1")
ONE = (None,)
NEXTN3 = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"]


def caps(args: list[str], version: str, tp: int) -> list[tuple[str, str, tuple[str | None, ...]]]:
    return [(c.owner, c.phase, c.ranks) for c in expected_captures(args, version, tp)]


@pytest.mark.parametrize(
    ("args", "version", "tp", "expected"),
    [
        # plain command, every generation
        ([], "0.5.23", 1, [("target", "prefill", ONE), ("target", "decode", ONE)]),
        (["--tp-size", "2"], "0.5.23", 2, [("target", "prefill", T2), ("target", "decode", T2)]),
        (["--tp-size", "2"], "0.5.17", 2, [("target", "prefill", T2), ("target", "decode", T2)]),
        # 0.5.14: the default prefill backend is tc_piecewise (on), breakable only from 0.5.15
        ([], "0.5.14", 1, [("target", "prefill", ONE), ("target", "decode", ONE)]),
        # 0.5.14 skips an EAGLE/NEXTN target's prefill graph unless it is breakable (#28386)
        (NEXTN3, "0.5.14", 1, [("target", "verify", ONE), ("draft", "decode", ONE),
                               ("draft", "extend", ONE)]),
        ([*NEXTN3, "--enable-return-hidden-states"], "0.5.14", 1,
         [("target", "prefill", ONE), ("target", "verify", ONE), ("draft", "decode", ONE),
          ("draft", "extend", ONE)]),
        (["--speculative-algorithm", "NGRAM"], "0.5.14", 1,
         [("target", "prefill", ONE), ("target", "verify", ONE)]),
        # <=0.5.13: the piecewise graph is certain only when enforced (no line says it is off)
        ([], "0.5.13", 1, [("target", "legacy", ONE)]),
        (["--enforce-piecewise-cuda-graph"], "0.5.13", 1,
         [("target", "piecewise", ONE), ("target", "legacy", ONE)]),
        (["--disable-cuda-graph"], "0.5.13", 1, []),
        # the disagreements: rules that turn the prefill graph off on 0.5.23
        (["--enable-kv-cache-sharding"], "0.5.23", 1, [("target", "decode", ONE)]),
        (["--dcp-size", "2"], "0.5.23", 1, [("target", "decode", ONE)]),
        (["--decode-context-parallel-size", "2"], "0.5.23", 1, [("target", "decode", ONE)]),  # alias
        (["--pipeline-parallel-size", "2"], "0.5.23", 1, [("target", "decode", ONE)]),
        (["--moe-a2a-backend", "mooncake"], "0.5.23", 1, [("target", "decode", ONE)]),
        (["--disaggregation-mode", "decode"], "0.5.23", 1, [("target", "decode", ONE)]),
        (["--enable-two-batch-overlap"], "0.5.23", 1, [("target", "decode", ONE)]),
        (["--pp-size", "2"], "0.5.23", 1, [("target", "decode", ONE)]),
        # an explicit backend locks the choice against the auto rules, not against the hard ones
        (["--pp-size", "2", "--cuda-graph-backend-prefill", "breakable"], "0.5.23", 1,
         [("target", "prefill", ONE), ("target", "decode", ONE)]),
        (["--enable-kv-cache-sharding", "--cuda-graph-backend-prefill", "breakable"], "0.5.23", 1,
         [("target", "decode", ONE)]),
        (["--deepep-mode", "normal"], "0.5.23", 1, []),
        (["--moe-a2a-backend", "deepep_v2", "--cuda-graph-backend-prefill", "breakable"], "0.5.23", 1,
         [("target", "decode", ONE)]),  # ignores the lock (moe_hook.py)
        (["--enable-kv-cache-sharding", *NEXTN3], "0.5.23", 1, []),  # no shard plan for spec graphs
        # the JSON config outranks the per-phase flags
        (["--cuda-graph-config", '{"prefill": {"backend": "disabled"}}', "--cuda-graph-backend-prefill",
          "breakable"], "0.5.23", 1, [("target", "decode", ONE)]),
        # switches and backends
        (["--disable-cuda-graph"], "0.5.23", 1, []),
        (["--disable-prefill-cuda-graph"], "0.5.23", 1, [("target", "decode", ONE)]),
        (["--cuda-graph-backend-decode", "disabled"], "0.5.23", 1, [("target", "prefill", ONE)]),
        (["--cuda-graph-backend-decode", "full", "--disable-decode-cuda-graph"], "0.5.23", 1,
         [("target", "prefill", ONE), ("target", "decode", ONE)]),  # the backend flag wins
        (["--cuda-graph-backend-prefill", "tc_piecewise"], "0.5.22", 1, [("target", "decode", ONE)]),
        # speculative decoding: verify on every rank, draft decode/extend on rank 0 only
        (["--tp-size", "2", *NEXTN3], "0.5.23", 2,
         [("target", "prefill", T2), ("target", "verify", T2), ("draft", "prefill", T2),
          ("draft", "decode", ("TP0",)), ("draft", "extend", ("TP0",))]),
        (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1"], "0.5.23", 1,
         [("target", "prefill", ONE), ("target", "verify", ONE), ("draft", "prefill", ONE),
          ("draft", "extend", ONE)]),
        (["--speculative-algorithm", "NGRAM"], "0.5.23", 1,
         [("target", "prefill", ONE), ("target", "verify", ONE)]),  # no draft model
        (["--cuda-graph-backend-prefill", "full", *NEXTN3], "0.5.23", 1,  # draft prefill: breakable only
         [("target", "prefill", ONE), ("target", "verify", ONE), ("draft", "decode", ONE),
          ("draft", "extend", ONE)]),
        (["--tp-size", "2", *NEXTN3], "0.5.13", 2,
         [("target", "legacy", T2), ("draft", "legacy", ("TP0",)), ("draft", "extend", ("TP0",))]),
        # data parallel: one rank label per DP x TP rank, draft graphs on TP0 of each DP group
        (["--tp-size", "2", "--dp-size", "2"], "0.5.23", 2,
         [("target", "prefill", ("DP0 TP0", "DP0 TP1", "DP1 TP0", "DP1 TP1")),
          ("target", "decode", ("DP0 TP0", "DP0 TP1", "DP1 TP0", "DP1 TP1"))]),
    ],
)
def test_expected_captures(args: list[str], version: str, tp: int,
                           expected: list[tuple[str, str, tuple[str | None, ...]]]) -> None:
    assert caps(args, version, tp) == expected


COMMANDS = [
    [], ["--enable-kv-cache-sharding"], ["--dcp-size", "2"], ["--pp-size", "2"],
    ["--enable-two-batch-overlap"], ["--moe-a2a-backend", "mooncake"], ["--moe-a2a-backend", "deepep"],
    ["--disaggregation-mode", "decode"], ["--deepep-mode", "normal"], ["--disable-cuda-graph"],
    ["--disable-prefill-cuda-graph"], ["--cuda-graph-backend-prefill", "disabled"],
    ["--cuda-graph-backend-prefill", "breakable", "--pp-size", "2"], ["--enable-lora"],
    ["--enable-dp-attention"], ["--enforce-piecewise-cuda-graph"], ["--disable-piecewise-cuda-graph"],
    ["--cuda-graph-backend-decode", "disabled"], NEXTN3, ["--enable-kv-cache-sharding", *NEXTN3],
    ["--moe-a2a-backend", "deepep_v2"],
]
VERSIONS = ["0.5.13", "0.5.14", "0.5.17", "0.5.19", "0.5.20", "0.5.22", "0.5.23"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "plain")
def test_the_ready_gate_and_doctor_agree(args: list[str], version: str) -> None:
    decode, prefill = graph_phases(parse_flags(args), version, None)
    phases = {phase for owner, phase, _ in caps(args, version, 1) if owner == "target"}
    if version == "0.5.13":
        assert ("legacy" in phases) == decode.on
        # the gate waits for the piecewise graph only where doctor is certain it is on
        assert ("piecewise" in phases) == (prefill.on and prefill.certain)
    else:
        assert bool(phases & {"decode", "verify"}) == decode.on
        assert ("prefill" in phases) == prefill.on


VLM = parse_model_config(
    {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "vision_config": {}, "num_hidden_layers": 4})


def test_doctor_is_more_precise_with_the_model_and_the_gate_is_settled_by_the_engine_line() -> None:
    # Without config.json the gate expects the prefill graph; the engine's `Disable prefill CUDA
    # graph because ...` line settles it (engine/graphs.settled_by_prefill_off).
    _, prefill = graph_phases(parse_flags([]), "0.5.23", VLM)
    assert not prefill.on
    assert any("allow-list" in r for r in prefill.reasons)
    _, unknown = graph_phases(parse_flags([]), "0.5.13", None)
    assert unknown.on and not unknown.certain


def test_doctor_names_the_profile_of_each_graph_finding() -> None:
    # On the H200 two profiles' findings printed `graph.prefill.on` and `graph.prefill.off` side by
    # side: each finding carries its profile, in the JSON and under a header in the text.
    findings = (audit_profile(ProfileView("tuned", ()), "0.5.17")
                + audit_profile(ProfileView("safe", ("--cuda-graph-backend-prefill", "disabled")), "0.5.17"))
    report = Report(findings=findings)
    graph = [(f["code"], f["profile"]) for f in report.to_json()["findings"]
             if f["code"].startswith("graph.")]
    assert graph == [("graph.decode.on", "tuned"), ("graph.prefill.on", "tuned"),
                     ("graph.prefill.off", "safe"), ("graph.decode.on", "safe")]
    text = format_human(report)
    assert text.index("-- profile tuned") < text.index("prefill CUDA graph: on") < text.index(
        "-- profile safe") < text.index("prefill CUDA graph: OFF")
