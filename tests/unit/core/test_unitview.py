"""What the unit sees (unitview) and doctor's live fallback finding: pure rules, no systemd."""

from __future__ import annotations

from sglang_supervisor.commands.unitcheck import unit_for
from sglang_supervisor.core.audit import fallback_findings
from sglang_supervisor.core.unitview import (
    Need,
    UnitSandbox,
    sandbox_from_show,
    shipped_sandbox,
    unit_view_findings,
)
from sglang_supervisor.engine.modelinfo import looks_like_hub_id

SHOW = {
    "LoadState": "loaded", "User": "sglang", "ProtectHome": "yes", "ProtectSystem": "strict",
    "StateDirectory": "sglang-supervisor", "LogsDirectory": "sglang-supervisor",
    "CacheDirectory": "sglang-supervisor", "RuntimeDirectory": "sglang-supervisor/qwen",
    "ReadWritePaths": "-/srv/scratch", "BindPaths": "", "BindReadOnlyPaths": "",
}  # fmt: skip


def codes(findings: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(f.code, f.what) for f in findings]


def test_a_pyenv_interpreter_is_hidden_from_the_unit_with_the_fix() -> None:
    sb = sandbox_from_show("sglang-qwen.service", SHOW, "systemctl show sglang-qwen.service")
    [f] = unit_view_findings([Need("supervisor's interpreter", "/root/.pyenv/versions/3.12.4/bin/python3.12",
                                   fix="rebuild the venv with PYTHON=/usr/bin/python3")], sb)
    assert f.severity == "error" and f.code == "unit.hidden"
    assert "ProtectHome=yes hides /root" in f.why and f.fix == "rebuild the venv with PYTHON=/usr/bin/python3"


def test_a_model_under_home_gets_the_bind_drop_in_and_a_bound_path_is_visible() -> None:
    sb = sandbox_from_show("sglang-qwen.service", SHOW, "systemctl show")
    [f] = unit_view_findings([Need("model", "/home/alice/models/Qwen3")], sb)
    assert f.code == "unit.hidden"
    assert "ProtectHome=tmpfs" in f.fix and "BindReadOnlyPaths=/home/alice/models" in f.fix
    bound = sandbox_from_show("sglang-qwen.service", {**SHOW, "ProtectHome": "tmpfs",
                                                      "BindReadOnlyPaths": "/home/alice/models"}, "show")
    assert codes(unit_view_findings([Need("model", "/home/alice/models/Qwen3")], bound))[0][0] == "unit.ok"
    relaxed = sandbox_from_show("x.service", {**SHOW, "ProtectHome": "read-only"}, "show")
    assert codes(unit_view_findings([Need("model", "/home/alice/models/Qwen3")], relaxed))[0][0] == "unit.ok"


def test_writable_paths_under_protect_system_strict() -> None:
    sb = sandbox_from_show("sglang-qwen.service", SHOW, "show")
    assert sb.writable[:4] == ("/var/lib/sglang-supervisor", "/var/log/sglang-supervisor",
                               "/var/cache/sglang-supervisor", "/run/sglang-supervisor/qwen")
    found = unit_view_findings([
        Need("state directory", "/var/lib/sglang-supervisor", write=True),
        Need("engine log directory", "/data/logs", write=True),
        Need("scratch", "/srv/scratch/x", write=True),
        Need("model", "/data/models/q"),  # read-only is fine for reading
    ], sb)
    assert [f.code for f in found] == ["unit.ok", "unit.read_only", "unit.ok", "unit.ok"]
    assert "ReadWritePaths=/data/logs" in found[1].fix


def test_a_directory_the_service_user_cannot_enter() -> None:
    sb = shipped_sandbox("sglang-supervisor@llama.service")
    assert "/run/sglang-supervisor/llama" in sb.writable and sb.protect_home == "yes"
    [f] = unit_view_findings([Need("model", "/srv/private/m", blocked_by="/srv/private")], sb)
    assert f.code == "unit.unreachable" and "/srv/private" in f.why and "sglang" in f.what


def test_no_protect_home_hides_nothing() -> None:
    sb = UnitSandbox("x.service", "test", protect_home="no", protect_system="no")
    assert [f.code for f in unit_view_findings([Need("model", "/root/m")], sb)] == ["unit.ok"]


def test_unit_for_prefers_the_rendered_unit_that_runs_this_file() -> None:
    def systemctl(args: object) -> str:
        argv = list(args)  # type: ignore[call-overload]
        if "--property=ExecStart" in argv:
            return "ExecStart={ argv[]=/opt/venvs/sglang-supervisor/bin/sglang-supervisor run --config " \
                   "/etc/sglang-supervisor/qwen.yaml }"
        return "\n".join(f"{k}={v}" for k, v in SHOW.items())

    found = unit_for("/etc/sglang-supervisor/qwen.yaml", systemctl)
    assert found is not None and found[0] == "sglang-qwen.service" and found[1]["User"] == "sglang"
    # no systemd: the template instance with the shipped settings; a file elsewhere: no unit
    instance = ("sglang-supervisor@llama.service", {})
    assert unit_for("/etc/sglang-supervisor/llama.yaml", lambda a: None) == instance
    assert unit_for("/tmp/mine.yaml", lambda a: None) is None


def test_fallback_finding_names_the_profile_level_and_cause() -> None:
    names = ["tuned", "no-prefill-graph", "eager"]
    status = {"profile": "no-prefill-graph", "attempts": [
        {"profile": "tuned", "failure_class": "prefill_graph_failed"},
        {"profile": "no-prefill-graph", "failure_class": None}], "skipped_known_bad": {}}
    [f] = fallback_findings(status, names)
    assert f.severity == "warning" and f.code == "live.fallback"
    assert "fallback profile no-prefill-graph (level 1 of the ladder), not tuned" in f.what
    assert "tuned failed (prefill_graph_failed)" in f.why
    [ok] = fallback_findings({**status, "profile": "tuned"}, names)
    assert ok.severity == "ok"
    assert fallback_findings(None, names) == [] and fallback_findings({"profile": None}, names) == []
    [known] = fallback_findings({"profile": "eager", "skipped_known_bad": {"tuned": 1}}, names)
    assert "known bad: tuned" in known.why


def test_hub_ids_are_not_paths() -> None:
    assert looks_like_hub_id("Qwen/Qwen3.6-27B")
    assert not looks_like_hub_id("/srv/models/Qwen3.6-27B")
    assert not looks_like_hub_id("models")
    assert not looks_like_hub_id("a/b/c")


def test_doctor_url_names_a_fidelity_mismatch_and_an_accept_collapse_from_status() -> None:
    from sglang_supervisor.core.audit import fidelity_findings

    status = {"fidelity": {"last_check": {"result": "mismatch", "profile": "tuned", "reason": "prefix",
                                          "detail": "diverged at token 0", "prompt": "p",
                                          "expected": "a", "received": "b"}},
              "throughput": {"spec_accept_length": 1.02, "baseline_spec_accept_length": 3.1}}
    got = {f.code: f for f in fidelity_findings(status)}
    assert got["live.fidelity"].severity == "error" and "tuned" in got["live.fidelity"].what
    assert "'a'" in got["live.fidelity"].why and "'b'" in got["live.fidelity"].why
    assert "1.02" in got["live.accept_collapse"].what and "3.10" in got["live.accept_collapse"].what
    assert fidelity_findings({"throughput": {"spec_accept_length": 2.9,
                                             "baseline_spec_accept_length": 3.1}}) == []
    assert fidelity_findings(None) == []
