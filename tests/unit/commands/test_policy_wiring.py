"""Pure helpers around the lifecycle: capture expectations from argv, policy settings, demo config."""

from __future__ import annotations

from pathlib import Path

import yaml

from sglang_supervisor.commands.demo import demo_config_data
from sglang_supervisor.core.config import parse_config
from sglang_supervisor.engine.argv import parse_flags, tp_size
from sglang_supervisor.shell.files.configfile import default_demo_config_path
from sglang_supervisor.shell.supervisor import capture_keys, policy_settings


def test_flag_value_and_tp_size() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--tp-size", "2", "--port=30000"]
    assert parse_flags(argv).last(["--port"]) == "30000"
    assert tp_size(argv) == 2
    assert tp_size(["--tp", "4"]) == 4
    assert tp_size(["--model-path", "m"]) == 1
    assert tp_size(["--tp-size", "two"]) == 1


def test_capture_keys_per_rank_for_tp2_nextn() -> None:
    argv = ["--tp-size", "2", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"]
    keys = capture_keys(argv, "0.5.23")
    assert ("target", "verify", "TP0") in keys and ("target", "verify", "TP1") in keys
    assert ("target", "prefill", "TP1") in keys
    assert ("draft", "extend", "TP0") in keys and ("draft", "extend", "TP1") not in keys
    assert capture_keys(["--disable-cuda-graph"], "0.5.23") == frozenset()


def test_policy_settings_from_config() -> None:
    config = parse_config(default_demo_config_path().read_text())
    s = policy_settings(config, last_good="low-mem", known_bad={"tuned": "hang"},
                        retry_known_bad=False)
    assert s.profiles[0] == "tuned" and s.last_good == "low-mem"
    assert s.remediation["prefill_graph_failed"] == "no-prefill-graph"
    assert s.stall_s == config.timeouts.stall_s and s.health_failures == config.timeouts.health_failures


def test_demo_fault_goes_to_the_first_profile_only(tmp_path: Path) -> None:
    base = yaml.safe_load(default_demo_config_path().read_text())
    data = demo_config_data(base, tmp_path, engine_port=31234, time_scale=0.01,
                            faults=["capture-fail:prefill", "kv-oom"])
    config = parse_config(yaml.safe_dump(data))
    assert config.profiles[0].env["SGLANG_SIM_FAULTS"] == "capture-fail:prefill,kv-oom"
    assert all("SGLANG_SIM_FAULTS" not in p.env for p in config.profiles[1:])
    assert config.engine.env["SGLANG_SIM_TIME_SCALE"] == "0.01"
    assert config.engine.port == 31234
    assert config.state_dir == str(tmp_path / "state")
    assert config.engine.log_file == str(tmp_path / "engine.log")
    assert "SGLANG_SIM_FAULTS" not in base["profiles"][0].get("env", {})  # the input is not changed
