"""`check` and `render` on the command line: exit codes, report on stderr, JSON, redaction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_supervisor.cli import main

LADDER = ["tuned", "no-prefill-graph", "low-mem", "no-spec", "eager"]
Capture = pytest.CaptureFixture[str]
REPO = Path(__file__).resolve().parents[3]
QWEN = str(REPO / "etc" / "sglang-supervisor" / "qwen.yaml")
DEMO = str(REPO / "etc" / "sglang-supervisor" / "demo.yaml")


def run(capsys: Capture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_check_qwen_offline_is_ok(capsys: Capture) -> None:
    code, out, err = run(capsys, "check", "-c", QWEN, "--sglang-version", "0.5.23")
    assert code == 0, err
    assert out.startswith(f"OK {QWEN}: 5 profiles, sglang 0.5.23")
    assert "tuned: 2 migrations, 1 warning" in out
    assert "--enforce-piecewise-cuda-graph -> --cuda-graph-backend-prefill breakable" in out


def test_check_demo_uses_the_configured_version(capsys: Capture) -> None:
    code, out, _ = run(capsys, "check", "-c", DEMO, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["ok"] is True
    assert doc["sglang_version"] == "0.5.23"
    assert [p["name"] for p in doc["profiles"]] == LADDER


def test_check_bad_config_exits_78_with_the_report(tmp_path: Path, capsys: Capture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(DEMO).read_text().replace("  capture_oom: low-mem", "  capture_oom: lowmem"))
    code, out, err = run(capsys, "check", "-c", str(bad))
    assert code == 78
    assert out == ""
    assert "remediation.capture_oom" in err and "did you mean 'low-mem'?" in err
    assert "Traceback" not in err
    code, out, _ = run(capsys, "check", "-c", str(bad), "--json")
    doc = json.loads(out)
    assert code == 78 and doc["ok"] is False
    assert doc["problems"][0]["path"] == "remediation.capture_oom"


def test_check_reports_flags_the_engine_would_refuse(tmp_path: Path, capsys: Capture) -> None:
    bad = tmp_path / "bad.yaml"
    text = Path(DEMO).read_text()
    bad.write_text(text.replace("speculative-algorithm: NEXTN", "speculative-algorithm: MTP"))
    code, _, err = run(capsys, "check", "-c", str(bad))
    assert code == 78
    assert "engine.args.speculative-algorithm" in err
    assert "NEXTN" in err


def test_check_missing_engine_is_78_not_a_traceback(capsys: Capture) -> None:
    code, _, err = run(capsys, "check", "-c", QWEN.replace("qwen.yaml", "absent.yaml"))
    assert code == 78
    assert "cannot read" in err


def test_render_qwen_json_for_0523_and_0513(capsys: Capture) -> None:
    code, out, _ = run(capsys, "render", "-c", QWEN, "-p", "tuned", "--sglang-version", "0.5.23",
                       "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["profile"] == "tuned"
    argv = doc["argv"]
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "breakable"
    assert argv[argv.index("--mamba-radix-cache-strategy") + 1] == "extra_buffer"
    assert "--enforce-piecewise-cuda-graph" not in argv and "--mamba-scheduler-strategy" not in argv
    assert "SGLANG_ENABLE_SPEC_V2" not in doc["env"]
    assert doc["migrations"]
    code, out, _ = run(capsys, "render", "-c", QWEN, "-p", "tuned", "--sglang-version", "0.5.13",
                       "--format", "json")
    assert code == 0
    assert "--enforce-piecewise-cuda-graph" in json.loads(out)["argv"]


def test_render_all_profiles_json_is_a_list(capsys: Capture) -> None:
    code, out, _ = run(capsys, "render", "-c", DEMO, "--format", "json")
    assert code == 0
    docs = json.loads(out)
    assert [d["profile"] for d in docs] == LADDER


def test_render_shell(capsys: Capture) -> None:
    code, out, _ = run(capsys, "render", "-c", QWEN, "-p", "no-spec", "--sglang-version", "0.5.23")
    assert code == 0
    assert out.startswith("# profile no-spec (sglang 0.5.23)")
    assert "# migrated: --mamba-scheduler-strategy extra_buffer -> --mamba-radix-cache-strategy" in out
    assert ("/opt/sglang/.venv/bin/python3 -m sglang.launch_server \\\n"
            "  --model-path Qwen/Qwen3.6-27B") in out


def test_render_unknown_profile_lists_the_names(capsys: Capture) -> None:
    code, out, err = run(capsys, "render", "-c", QWEN, "-p", "fast", "--sglang-version", "0.5.23")
    assert code == 78
    assert out == ""
    assert "tuned, no-prefill-graph, low-mem, no-spec, eager" in err


def test_render_redacts_and_never_reads_the_key(tmp_path: Path, capsys: Capture) -> None:
    key = tmp_path / "key"
    key.write_text("sk-top-secret-0042\n")
    key.chmod(0o600)
    cfg = tmp_path / "c.yaml"
    text = Path(DEMO).read_text().replace("  host: 127.0.0.1", f"  host: 127.0.0.1\n  api_key_file: {key}")
    cfg.write_text(text + "runtime_dir: /run/demo\n")
    for fmt in ("shell", "json"):
        code, out, err = run(capsys, "render", "-c", str(cfg), "-p", "tuned", "--format", fmt)
        assert code == 0, err
        assert "sk-top-secret-0042" not in out + err
        assert "/run/demo/demo-engine-secrets.yaml" in out
    code, out, err = run(capsys, "check", "-c", str(cfg), "--json")
    assert code == 0 and "sk-top-secret-0042" not in out + err


def test_check_refuses_a_value_of_the_wrong_type(tmp_path: Path, capsys: Capture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(DEMO).read_text().replace("max-running-requests: 16",
                                                   "max-running-requests: banana"))
    code, _, err = run(capsys, "check", "-c", str(bad))
    assert code == 78
    assert "--max-running-requests: invalid int value 'banana'" in err
    assert "Traceback" not in err


def _with_remembered_derived(tmp_path: Path) -> str:
    """demo.yaml with its own state directory, whose state file remembers that the derived
    `tuned-graph-bs-8` served (as `run` records it after a capture OOM, issue 25)."""
    import yaml

    from sglang_supervisor.core.derive import Derivation
    from sglang_supervisor.shell.files.state import StateStore

    data = yaml.safe_load(Path(DEMO).read_text())
    data["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(data))
    d = Derivation("tuned-graph-bs-8", "tuned", (), {"cuda-graph-max-bs-decode": 8}, 1,
                   "--cuda-graph-max-bs-decode 16 -> 8", "Capture cuda graph failed: CUDA out of memory")
    StateStore(data["state_dir"], data["name"]).mark_serving("fp", d.name, 1.0, False, derived=d)
    return str(path)


def test_render_shows_a_remembered_derived_profile_with_its_base_and_change(
        tmp_path: Path, capsys: Capture) -> None:
    path = _with_remembered_derived(tmp_path)
    code, out, _ = run(capsys, "render", "--config", path)
    assert code == 0
    block = out.split("# profile tuned-graph-bs-8 ", 1)[1]
    assert "derived from tuned: --cuda-graph-max-bs-decode 16 -> 8" in block.replace("\n# ", " ")
    assert "--cuda-graph-max-bs-decode 8" in block
    code, out, _ = run(capsys, "render", "--config", path, "--profile", "tuned-graph-bs-8",
                       "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["derived"]["base"] == "tuned"
    assert doc["derived"]["asked_by"].startswith("Capture")
    assert doc["argv"][doc["argv"].index("--cuda-graph-max-bs-decode") + 1] == "8"
    # Without a state file nothing is invented, and the name is unknown again.
    code, _, err = run(capsys, "render", "--config", DEMO, "--profile", "tuned-graph-bs-8")
    assert code == 78 and "no profile is named 'tuned-graph-bs-8'" in err
