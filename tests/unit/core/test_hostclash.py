"""Models on one host: what each claims and which claims clash (core/hostclash.py), the copy a
second model starts from (core/modelcopy.py), and `check` refusing a clash with the host's others."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor import cli
from sglang_supervisor.core.config import parse_config
from sglang_supervisor.core.hostclash import claims_of, clashes, free_port, hosts_overlap
from sglang_supervisor.core.modelcopy import retarget

BASE = """\
name: {name}
engine:
  command: [{command}]
  model_path: org/m
  port: {port}
  log_file: /var/log/sglang-supervisor/{log}.log
  args:
    tp-size: {tp}
{extra_args}  env: {{{env}}}
metrics:
  address: 127.0.0.1:{metrics}
profiles:
  - name: tuned
{gateway}"""


def cfg(name: str = "a", *, port: int = 30000, metrics: int = 9400, log: str | None = None, tp: int = 2,
        env: str = "", command: str = "python3, -m, sglang.launch_server", extra_args: str = "",
        gateway: str = "", state_dir: str = "") -> str:
    text = BASE.format(name=name, port=port, metrics=metrics, log=log or name, tp=tp, env=env,
                       command=command, extra_args=extra_args, gateway=gateway)
    return text + (f"state_dir: {state_dir}\n" if state_dir else "")


def claims(text: str, source: str = "x.yaml"):  # type: ignore[no-untyped-def]
    return claims_of(parse_config(text), source)


def paths(mine: str, *others: str) -> list[str]:
    theirs = [claims(o, f"{i}.yaml") for i, o in enumerate(others)]
    return sorted(p.path for p in clashes(claims(mine), theirs))


def test_distinct_models_do_not_clash() -> None:
    assert paths(cfg("a"), cfg("b", port=30001, metrics=9401, env="CUDA_VISIBLE_DEVICES: '2,3'")) == []


def test_a_copied_model_clashes_on_every_claim_naming_both_models_and_the_fix() -> None:
    problems = clashes(claims(cfg("b", log="a")), [claims(cfg("a"), "/etc/sglang-supervisor/a.yaml")])
    assert sorted(p.path for p in problems) == [
        "engine.env.CUDA_VISIBLE_DEVICES", "engine.log_file", "engine.port", "metrics.address"]
    port = next(p for p in problems if p.path == "engine.port")
    assert "model 'a' (/etc/sglang-supervisor/a.yaml)" in port.problem
    assert "30001" in port.fix  # a port nobody claims
    metrics = next(p for p in problems if p.path == "metrics.address")
    assert "127.0.0.1:9401" in metrics.fix
    assert "b-engine.log" in next(p for p in problems if p.path == "engine.log_file").fix


def test_the_engine_port_of_one_is_the_metrics_port_of_another() -> None:
    assert paths(cfg("a", port=9400, metrics=9500), cfg("b", port=30001, metrics=9400,
                                                        env="CUDA_VISIBLE_DEVICES: '4'")) == ["engine.port"]


@pytest.mark.parametrize(("a", "b", "overlap"), [
    ("127.0.0.1", "127.0.0.1", True), ("0.0.0.0", "127.0.0.1", True), ("::", "10.0.0.1", True),
    ("localhost", "127.0.0.1", True), ("10.0.0.1", "10.0.0.2", False), ("127.0.0.1", "::1", False),
])
def test_hosts_overlap_when_equal_or_either_is_a_wildcard(a: str, b: str, overlap: bool) -> None:
    assert hosts_overlap(a, b) is overlap


def test_same_name_and_state_dir_share_a_state_file() -> None:
    assert "name" in paths(cfg("a"), cfg("a", port=30001, metrics=9401, log="other",
                                         env="CUDA_VISIBLE_DEVICES: '2,3'"))
    assert paths(cfg("a"), cfg("a", port=30001, metrics=9401, log="other", state_dir="/srv/s",
                              env="CUDA_VISIBLE_DEVICES: '2,3'")) == []


def test_two_gateway_models_in_one_state_dir_share_the_registration_record() -> None:
    gw = "gateway:\n  url: http://10.0.0.5:30080\n"
    other = cfg("b", port=30001, metrics=9401, env="CUDA_VISIBLE_DEVICES: '2,3'", gateway=gw)
    assert paths(cfg("a", gateway=gw), other) == ["state_dir"]
    assert paths(cfg("a"), other) == []  # only one registers


@pytest.mark.parametrize(("mine", "other", "clash"), [
    ({"env": "CUDA_VISIBLE_DEVICES: '0,1'"}, {"env": "CUDA_VISIBLE_DEVICES: '1,2'"}, True),
    ({"env": "CUDA_VISIBLE_DEVICES: '0,1,2,3'", "tp": 2}, {"env": "CUDA_VISIBLE_DEVICES: '2,3'"}, False),
    ({}, {"env": "CUDA_VISIBLE_DEVICES: '1'", "tp": 1}, True),  # no CUDA_VISIBLE_DEVICES: GPUs 0 and 1
    ({"tp": 4}, {"env": "CUDA_VISIBLE_DEVICES: '3'", "tp": 1}, True),  # the TP size counts
    ({"extra_args": "    base-gpu-id: 2\n"}, {}, False),  # GPUs 2,3 against 0,1
    ({"extra_args": "    dp-size: 2\n"}, {"env": "CUDA_VISIBLE_DEVICES: '3'", "tp": 1}, True),
    ({"command": "sglang-sim"}, {}, False),  # the simulator holds no GPU
])
def test_gpus_clash_through_cuda_visible_devices_and_the_parallel_sizes(
        mine: dict[str, object], other: dict[str, object], clash: bool) -> None:
    found = paths(cfg("a", **mine), cfg("b", port=30001, metrics=9401, **other))  # type: ignore[arg-type]
    assert found == (["engine.env.CUDA_VISIBLE_DEVICES"] if clash else [])


def test_models_sized_to_share_a_gpu_do_not_clash() -> None:
    half = "    mem-fraction-static: 0.45\n"
    assert paths(cfg("a", extra_args=half), cfg("b", port=30001, metrics=9401, extra_args=half)) == []
    assert paths(cfg("a", extra_args="    mem-fraction-static: 0.6\n"),
                 cfg("b", port=30001, metrics=9401, extra_args=half)) == ["engine.env.CUDA_VISIBLE_DEVICES"]


def test_free_port_skips_every_claimed_port() -> None:
    assert free_port(30000, {30000, 30001, 30003}) == 30002
    assert free_port(65535, {65535}) is None


def test_retarget_rewrites_values_in_place_keeping_comments_and_adds_missing_keys() -> None:
    text = "# top\nname: qwen  # the model\nengine:\n    port: 30000   # engine\n    args:\n      port: 1\n" \
           "metrics:\n  enabled: true\n"
    out = retarget(text, "llama", {("engine", "port"): "30001", ("engine", "log_file"): "/l.log",
                                   ("metrics", "address"): '"127.0.0.1:9401"', ("gateway", "url"): "u"})
    assert out.splitlines() == [
        "# top", "name: llama", "engine:", "    log_file: /l.log", "    port: 30001   # engine",
        "    args:", "      port: 1", "metrics:", '  address: "127.0.0.1:9401"', "  enabled: true",
        "gateway:", "  url: u"]
    assert parse_config(retarget(cfg("a"), "b", {("engine", "port"): "30005"})).engine.port == 30005
    assert retarget("engine: {}\n", "x", {}) == "name: x\nengine: {}\n"


def test_check_refuses_a_clash_with_another_model_in_the_same_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(cfg("a"))
    (tmp_path / "broken.yaml").write_text("engine: [\n")
    (tmp_path / "b.yaml").write_text(cfg("b"))
    assert cli.main(["check", "-c", str(tmp_path / "b.yaml"), "--sglang-version", "0.5.23"]) == 78
    err = capsys.readouterr().err
    assert (f"engine.port: port 30000 (127.0.0.1) is also engine.port of model 'a' "
            f"({tmp_path / 'a.yaml'})") in err
    assert f"not compared with {tmp_path / 'broken.yaml'}" in err
    assert cli.main(["check", "-c", str(tmp_path / "b.yaml"), "--sglang-version", "0.5.23", "--alone"]) == 0
    (tmp_path / "b.yaml").write_text(cfg("b", port=30001, metrics=9401, env="CUDA_VISIBLE_DEVICES: '2,3'"))
    assert cli.main(["check", "-c", str(tmp_path / "b.yaml"), "--sglang-version", "0.5.23"]) == 0


def test_run_names_each_clash_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` started outside the unit (no `check` before it) still says what it collides with."""
    from structlog.testing import capture_logs

    from sglang_supervisor.commands import run

    class Stop(Exception):
        pass

    def stop(*_a: object) -> None:
        raise Stop

    (tmp_path / "a.yaml").write_text(cfg("a"))
    (tmp_path / "b.yaml").write_text(cfg("b"))
    monkeypatch.setattr(run, "detect_engine_version", lambda _c: "0.5.23")
    monkeypatch.setattr(run, "prepare", stop)  # what follows the clash report is not this test's
    with capture_logs() as logs, pytest.raises(Stop):
        run.load_and_prepare(str(tmp_path / "b.yaml"), "json")
    clashed = [e for e in logs if e["event"] == "host.clash"]
    assert {e["key"] for e in clashed} >= {"engine.port", "metrics.address"}
    assert all("'a'" in e["problem"] and e["fix"] for e in clashed)
