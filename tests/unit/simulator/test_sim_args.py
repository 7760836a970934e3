"""sglang-sim's command line: the emulated release's flag set, argparse's exit 2 and wording."""

from __future__ import annotations

import pytest

from seedargs import NEXTN_SPEC
from sglang_supervisor.simulator import cli
from sglang_supervisor.simulator.args import SimArgsError, load_config

BASE = ["--model-path", "Qwen/Qwen3.6-27B", "--port", "30000"]
SEED_NEXTN = [*BASE, "--tp-size", "2", *NEXTN_SPEC]


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse exits by itself, as SGLang's does
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_unknown_flag_exits_2_with_argparse_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(
        [*BASE, "--mamba-scheduler-strategyy", "extra_buffer", "--sim-version", "0.5.17"], capsys
    )
    assert code == 2
    assert err.startswith("usage: sglang serve [-h] --model-path MODEL_PATH")
    assert err.rstrip().endswith(
        "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategyy extra_buffer"
    )


@pytest.mark.parametrize("flag", ["--enforce-piecewise-cuda-graph", "--mamba-scheduler-strategy"])
def test_flags_removed_in_0_5_20_exit_2_under_0_5_23(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    extra = [flag] if flag.startswith("--enforce") else [flag, "extra_buffer"]
    code, err = run_main([*BASE, *extra, "--sim-version", "0.5.23"], capsys)
    assert code == 2
    assert f"sglang serve: error: unrecognized arguments: {' '.join(extra)}" in err


def test_enforce_piecewise_works_under_legacy() -> None:
    cfg = load_config([*BASE, "--enforce-piecewise-cuda-graph", "--sim-version", "legacy"], {})
    assert cfg.spec.version == "0.5.13"
    assert cfg.prefill_backend == "piecewise"
    assert cfg.spec.capture_style == "legacy"


def test_deprecated_aliases_accepted_by_0_5_17_and_listed() -> None:
    cfg = load_config(
        [*BASE, "--enforce-piecewise-cuda-graph", "--cuda-graph-max-bs", "8"],
        {"SGLANG_SIM_VERSION": "0.5.17"},
    )
    assert dict(cfg.deprecated) == {
        "--enforce-piecewise-cuda-graph": "--cuda-graph-backend-prefill=tc_piecewise",
        "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
    }
    assert cfg.prefill_backend == "tc_piecewise"


def test_bad_choice_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main([*BASE, "--cuda-graph-backend-prefill", "tc_piecewise"], capsys)
    assert code == 2
    assert "argument --cuda-graph-backend-prefill: invalid choice: 'tc_piecewise'" in err


def test_bad_int_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main([*BASE, "--tp-size", "two"], capsys)
    assert code == 2
    assert "argument --tp-size: invalid int value: 'two'" in err


def test_seed_profile_resolves() -> None:
    cfg = load_config(SEED_NEXTN, {})
    assert (cfg.tp_size, cfg.spec_algorithm, cfg.spec_steps, cfg.spec_draft_tokens) == (2, "NEXTN", 3, 4)
    assert cfg.decode_backend == "full" and cfg.prefill_backend == "breakable"
    assert cfg.max_running_requests == 48 and cfg.max_running_reset
    assert cfg.hybrid and cfg.model_gb == 54.0
    assert cfg.spec.has_ready_route and cfg.spec.clean_exit_code == 0


def test_0_5_17_behaviour_row() -> None:
    cfg = load_config(BASE, {"SGLANG_SIM_VERSION": "0.5.17"})
    assert not cfg.spec.has_ready_route
    assert cfg.spec.clean_exit_code == -9
    assert cfg.spec.server_args_style == "dataclass"


def test_disable_cuda_graph_turns_both_phases_off() -> None:
    cfg = load_config([*BASE, "--disable-cuda-graph"], {})
    assert (cfg.decode_backend, cfg.prefill_backend) == ("disabled", "disabled")
    assert "prefill.backend='disabled'" in cfg.prefill_disabled_reason


def test_config_file_supplies_flags_and_cli_overrides(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "serve.yaml"  # type: ignore[operator]
    path.write_text("api-key: s3cret\ntp-size: 2\nenable-metrics: true\n")
    cfg = load_config([*BASE, "--config", str(path), "--tp-size", "1"], {})
    assert cfg.api_key == "s3cret" and cfg.enable_metrics and cfg.tp_size == 1


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([*BASE, "--sim-fault", "explode"], {}, "unknown fault kind 'explode'"),
        (BASE, {"SGLANG_SIM_TIME_SCALE": "fast"}, "SGLANG_SIM_TIME_SCALE='fast' is not a number"),
        (BASE, {"SGLANG_SIM_VERSION": "0.4.0"}, "older than any emulated release"),
        ([*BASE, "--sim-fault", "crash+rank=3"], {}, "targets rank 3 but --tp-size is 1"),
    ],
)
def test_bad_simulator_input_is_a_clear_error(argv: list[str], env: dict[str, str], message: str) -> None:
    from sglang_supervisor.simulator.versions import UnknownVersionError

    with pytest.raises((SimArgsError, UnknownVersionError)) as err:
        load_config(argv, env)
    assert message in str(err.value)


def test_main_reports_simulator_errors_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main([*BASE, "--sim-fault", "capture-fail:sideways"], capsys)
    assert code == 2
    assert err.startswith("sglang-sim: error: fault 'capture-fail:sideways': unknown capture phase")


def test_fault_bound_to_a_flag_only_applies_to_that_profile() -> None:
    env = {"SGLANG_SIM_FAULTS": "capture-fail:prefill+when=--enforce-piecewise-cuda-graph"}
    from sglang_supervisor.simulator.args import active_faults

    assert active_faults(
        load_config([*BASE, "--enforce-piecewise-cuda-graph"], env | {"SGLANG_SIM_VERSION": "0.5.17"})
    )
    assert not active_faults(load_config(BASE, env))


def test_help_documents_simulator_flags_and_faults(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help", *SEED_NEXTN]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: sglang serve")
    for text in (
        "--sim-version",
        "--sim-fault",
        "--sim-decode-tps",
        "capture-fail:PHASE",
        "+when=--flag",
        "True rates for this command line",
        "SGLANG_SIM_TIME_SCALE",
    ):
        assert text in out


def test_log_requests_flags_reach_the_config() -> None:
    argv = [*BASE, "--log-requests", "--log-requests-level", "3", "--log-requests-format", "json"]
    cfg = load_config(argv, {})
    assert (cfg.log_requests, cfg.log_requests_level, cfg.log_requests_format) == (True, 3, "json")
    plain = load_config(list(BASE), {})
    assert (plain.log_requests, plain.log_requests_level, plain.log_requests_format) == (False, 2, "text")
