"""Per-rank startup scripts (pure): capture lines per rank, faults at the right moment."""

from __future__ import annotations

import pytest

from seedargs import NEXTN_SPEC
from sglang_supervisor.engine.argv import parse_flags
from sglang_supervisor.engine.graphs import graph_phases
from sglang_supervisor.simulator.args import active_faults, load_config
from sglang_supervisor.simulator.logfmt import line, progress_frames, rank_prefix, uvicorn_line
from sglang_supervisor.simulator.startup import Step, rank_script

BASE = ["--model-path", "Qwen/Qwen3.6-27B", "--port", "30000"]
NEXTN = [*BASE, "--tp-size", "2", *NEXTN_SPEC]


def script(argv: list[str], rank: int = 0, env: dict[str, str] | None = None) -> list[Step]:
    cfg = load_config(argv, env or {})
    return rank_script(cfg, rank, active_faults(cfg))


def logs(steps: list[Step]) -> list[str]:
    return [s.text for s in steps if s.kind == "log"]


def captures(steps: list[Step]) -> list[str]:
    return [
        t.split(" CUDA graph")[0] + (" end" if " end." in t else " begin")
        for t in logs(steps)
        if t.startswith("Capture ")
    ]


def test_nextn_tp2_verify_on_both_ranks_draft_decode_extend_on_tp0_only() -> None:
    tp0, tp1 = script(NEXTN, 0), script(NEXTN, 1)
    both = [
        "Capture target prefill begin",
        "Capture target prefill end",
        "Capture target verify begin",
        "Capture target verify end",
    ]
    draft = [
        "Capture draft decode begin",
        "Capture draft decode end",
        "Capture draft extend begin",
        "Capture draft extend end",
    ]
    assert captures(tp0) == both + draft
    assert captures(tp1) == both
    # The hybrid model's MTP draft has no prefill graph (real 0.5.17 on an H200,
    # tests/fixtures/sglang-0.5.17-h200-seed): it says so on every rank, after the target's graphs.
    for steps in (tp0, tp1):
        text = logs(steps)
        off = text.index("Disable prefill CUDA graph because some layers do not apply Standard GQA")
        verify_end = max(i for i, t in enumerate(text) if t.startswith("Capture target verify CUDA graph e"))
        assert off > verify_end
    assert tp0[-1].kind == "ready" and tp1[-1].kind == "ready"
    assert any(t.startswith("max_total_num_tokens=") for t in logs(tp0))
    assert not any(t.startswith("max_total_num_tokens=") for t in logs(tp1))
    assert all("num_tokens_per_req=4" in t for t in logs(tp0) if "target verify CUDA graph begin" in t)


def test_progress_bars_on_tp0_only() -> None:
    assert any(s.kind == "raw" and "Capturing batches" in s.text for s in script(NEXTN, 0))
    assert not any(s.kind == "raw" for s in script(NEXTN, 1))


def test_one_step_spec_has_no_draft_decode_graph() -> None:
    argv = [
        *NEXTN[:-6],
        "--speculative-num-steps",
        "1",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "2",
    ]
    assert "Capture draft decode begin" not in captures(script(argv))


def test_disabled_prefill_graph_prints_the_reason_and_skips_draft_prefill() -> None:
    steps = script([*NEXTN, "--cuda-graph-backend-prefill", "disabled"])
    assert any(
        t.startswith("Disable prefill CUDA graph because cuda_graph_config resolved") for t in logs(steps)
    )
    assert "Capture target prefill begin" not in captures(steps)
    assert "Capture draft prefill begin" not in captures(steps)


def test_eager_profile_captures_nothing() -> None:
    steps = script(
        [*BASE, "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    )
    assert captures(steps) == []
    assert steps[-1].kind == "ready"


def test_legacy_lines() -> None:
    steps = script([*BASE, "--enforce-piecewise-cuda-graph", "--sim-version", "legacy"])
    text = logs(steps)
    assert any(t.startswith("Capture piecewise CUDA graph begin. avail mem=") for t in text)
    assert any(t.startswith("Capture cuda graph begin. This can take up to several minutes.") for t in text)
    assert any(t.startswith("Capture cuda graph end. Time elapsed: ") for t in text)


def test_prefill_capture_oom_has_the_hint_then_sigquit() -> None:
    steps = script([*BASE, "--sim-fault", "capture-fail:prefill"])
    assert steps[-1].kind == "sigquit"
    text = "\n".join(logs(steps))
    assert "OutOfMemoryError: CUDA out of memory." in text
    assert "Fail when using backend: breakable for prefill runner." in text
    assert "1. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled" in text
    assert "Scheduler hit an exception: Traceback (most recent call last):" in text


def test_prefill_fault_does_not_fire_without_a_prefill_graph() -> None:
    steps = script([*BASE, "--cuda-graph-backend-prefill", "disabled", "--sim-fault", "capture-fail:prefill"])
    assert steps[-1].kind == "ready"


def test_verify_capture_error_is_wrapped_with_solutions() -> None:
    steps = script([*NEXTN, "--sim-fault", "capture-fail:verify:error"])
    text = "\n".join(logs(steps))
    assert "Exception: Capture cuda graph failed: CUDA error: operation not permitted" in text
    assert "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled." in text
    assert steps[-1].kind == "sigquit"


def test_failing_rank_sigquits_and_the_other_rank_waits() -> None:
    argv = [*NEXTN, "--sim-fault", "capture-fail:verify+rank=1"]
    assert script(argv, 1)[-1].kind == "sigquit"
    assert script(argv, 0)[-1].kind == "hang"


def test_draft_fault_hits_the_first_draft_graph() -> None:
    steps = script([*NEXTN, "--sim-fault", "capture-fail:draft"])
    assert captures(steps)[-1] == "Capture draft decode begin"  # the hybrid MTP draft has no prefill graph
    dense = ["--model-path", "Qwen/Qwen3-8B", "--port", "30000", "--speculative-algorithm", "STANDALONE",
             "--speculative-draft-model-path", "Qwen/Qwen3-0.6B", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    first_draft = captures(script([*dense, "--sim-fault", "capture-fail:draft"]))[-1]
    assert first_draft == "Capture draft prefill begin"


def test_dense_draft_captures_its_prefill_graph_and_hybrid_prefill_off_says_so_twice() -> None:
    dense = ["--model-path", "Qwen/Qwen3-8B", "--port", "30000", "--speculative-algorithm", "STANDALONE",
             "--speculative-draft-model-path", "Qwen/Qwen3-0.6B", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    assert "Capture draft prefill end" in captures(script(dense))  # standalone_spec.log, 2026-11-29
    off = [t for t in logs(script([*NEXTN, "--cuda-graph-backend-prefill", "disabled"]))
           if t.startswith("Disable prefill CUDA graph because")]
    assert len(off) == 2  # target, then the MTP draft (tuned-sbo-then-no-prefill-graph.engine.log)


def test_kv_pool_that_does_not_fit() -> None:
    steps = script([*BASE, "--mem-fraction-static", "0.2"])
    assert steps[-1].kind == "sigquit"
    assert any(
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.2" in t
        for t in logs(steps)
    )
    old = script([*BASE, "--sim-fault", "kv-oom", "--sim-version", "0.5.17"])
    assert any("ValueError: Loaded weights leave no GPU memory for the KV cache" in t for t in logs(old))


def test_hang_and_crash_during_load() -> None:
    hang = script([*BASE, "--sim-fault", "hang:load"])
    assert hang[-1].kind == "hang"
    assert not any(t.startswith("Load weight end") for t in logs(hang))
    assert script([*BASE, "--sim-fault", "crash:load"])[-1].kind == "die"
    assert script([*BASE, "--sim-fault", "crash:capture"])[-1].kind == "die"


def test_line_formats() -> None:
    assert line("hello", 0.5, ms=True, prefix=rank_prefix(1, 2)).endswith(".500 TP1] hello\n")
    assert rank_prefix(0, 1) == ""
    assert line("x", 0, ms=False).count("[") == 1
    assert "] INFO:     Uvicorn running" in uvicorn_line("Uvicorn running", 0)


def test_progress_frames_are_cr_separated_and_end_the_line() -> None:
    frames = progress_frames(
        ["Capturing batches (bs=2 avail_mem=1.00 GB)", "Capturing batches (bs=1 avail_mem=1.00 GB)"], 2.0
    )
    assert all(text.endswith("\r") for _, text in frames[:-1])
    assert frames[-1][1].endswith("100%|██████████| 2/2 [00:02<00:00,  1.00s/it]\n")
    assert sum(delay for delay, _ in frames) == 2.0


def test_sbo_on_an_sm90_gpu_fails_at_scheduler_start_as_real_0517_does() -> None:
    """Real 0.5.17 on an H200 refuses --enable-single-batch-overlap in the scheduler's constructor,
    before any weight loads (tests/fixtures/sglang-0.5.17-h200-seed); the simulator told its GPU is
    SM 9.0 does the same, and the supervisor's parser reads both as the same failure."""
    from pathlib import Path

    from sglang_supervisor.core.logwatch import parse_bytes, summarize

    argv = [*NEXTN, "--enable-single-batch-overlap"]
    steps = script(argv, env={"SGLANG_SIM_GPU_SM": "9.0"})
    assert [s.kind for s in steps] == ["log", "sigquit"]
    assert not captures(steps) and not any("Load weight" in t for t in logs(steps))
    fixture = (Path(__file__).resolve().parents[2] / "fixtures" / "sglang-0.5.17-h200-seed"
               / "tuned-sbo-then-no-prefill-graph.engine.log").read_text()
    real_line = next(x for x in fixture.splitlines() if x.startswith("ValueError: SBO"))
    assert real_line in logs(steps)[0].splitlines()
    sim = summarize(parse_bytes(line(logs(steps)[0], 0.0, ms=False).encode(), "0.5.17")).failure
    real = summarize(parse_bytes(fixture.split("Received sigquit")[0].encode(), "0.5.17")).failure
    assert sim is not None and real is not None
    assert sim["class"] == real["class"] and sim["message"] == real["message"]


def test_sbo_starts_on_other_gpus_and_sm90_without_sbo_starts() -> None:
    # The check is for compute capability 9.x only (the seed's RTX A6000 is SM 8.6).
    for argv, env in (([*NEXTN, "--enable-single-batch-overlap"], {"SGLANG_SIM_GPU_SM": "8.6"}),
                      ([*NEXTN, "--enable-single-batch-overlap"], {}),
                      (NEXTN, {"SGLANG_SIM_GPU_SM": "9.0"})):
        steps = script(argv, env=env)
        assert "Capture target verify end" in captures(steps), (argv, env)
        assert steps[-1].kind == "ready"


PLAIN = ["--model-path", "Qwen/Qwen3-8B", "--port", "30000"]


def _modern_versions() -> list[str]:
    from sglang_supervisor.engine.sglang import PER_PHASE_GRAPHS, at_least, known_versions

    return [v for v in known_versions() if at_least(v, PER_PHASE_GRAPHS)]


@pytest.mark.parametrize("version", _modern_versions())
def test_the_default_prefill_graph_is_the_one_engine_graphs_expects(version: str) -> None:
    """Default flags: the simulator captures the target prefill graph with the backend that
    engine/graphs (the READY gate's truth) says this release uses; 0.5.14's is tc_piecewise."""
    verdict = graph_phases(parse_flags(PLAIN), version, None)[1]
    steps = script(PLAIN, env={"SGLANG_SIM_VERSION": version})
    begins = [t for t in logs(steps) if t.startswith("Capture target prefill CUDA graph begin.")]
    assert verdict.on and len(begins) == 1
    assert f"backend={verdict.backend}," in begins[0]
    assert "Capture target prefill end" in captures(steps)


def test_0_5_14_eagle_target_skips_its_tc_piecewise_prefill_graph_on_every_rank() -> None:
    """Real 0.5.14 (model_runner.init_prefill_cuda_graph, #28386): an EAGLE/NEXTN target on
    tc_piecewise logs why instead of capturing, on each rank; breakable captures."""
    env = {"SGLANG_SIM_VERSION": "0.5.14"}
    for rank in (0, 1):
        steps = script(NEXTN, rank, env)
        assert "Capture target prefill begin" not in captures(steps)
        assert any(t.startswith("Disable prefill CUDA graph for EAGLE target on tc_piecewise")
                   for t in logs(steps))
    steps = script([*NEXTN, "--cuda-graph-backend-prefill", "breakable"], 0, env)
    assert "Capture target prefill end" in captures(steps)
