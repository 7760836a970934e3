"""`sglang-supervisor forget`: clears one model's memory, for one profile or all of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sglang_supervisor.cli import main
from sglang_supervisor.shell.files.state import StateStore

FP = "0123456789abcdef"


def config(tmp_path: Path, name: str = "qwen") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name,
        "engine": {"command": ["python3"], "model_path": "org/m"},
        "profiles": [{"name": "tuned"}, {"name": "no-prefill-graph"}, {"name": "low-mem"}],
        "state_dir": str(tmp_path / "state"),
    }))
    return path


def remember(tmp_path: Path, name: str = "qwen") -> StateStore:
    store = StateStore(tmp_path / "state", name)
    store.mark_good(FP, "low-mem", 10.0)
    store.mark_bad(FP, "tuned", "capture_oom", 20.0)
    store.mark_bad(FP, "tuned", "capture_oom", 30.0)
    store.mark_bad(FP, "no-prefill-graph", "hang", 30.0)
    return store


def test_forget_one_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = remember(tmp_path)
    other = remember(tmp_path, "llama")
    assert main(["forget", "--config", str(config(tmp_path)), "--profile", "tuned"]) == 0
    out = capsys.readouterr().out
    assert "forgot profile tuned" in out and "capture_oom, 2 failure(s) in a row" in out
    assert "qwen.state.json" in out
    assert list(store.known_bad(FP, 30.0, 1e9)) == ["no-prefill-graph"]
    assert store.last_good(FP) == "low-mem"  # still the fallback until tuned served
    assert sorted(other.known_bad(FP, 30.0, 1e9)) == ["no-prefill-graph", "tuned"]  # another model


def test_forget_everything_of_one_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = remember(tmp_path)
    assert main(["forget", "--config", str(config(tmp_path)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["forgotten"] == 3 and report["name"] == "qwen"
    assert {r["profile"] for r in report["records"]} == {"tuned", "no-prefill-graph"}
    assert store.known_bad(FP, 30.0, 1e9) == {} and store.last_good(FP) is None


def test_nothing_to_forget_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["forget", "--config", str(config(tmp_path)), "--profile", "tuned"]) == 0
    assert "nothing remembered" in capsys.readouterr().out
    assert not (tmp_path / "state").exists()  # not even the directory is created
    store = StateStore(tmp_path / "state", "qwen")
    store.mark_bad(FP, "low-mem", "hang", 1.0)
    before = store.path.stat().st_mtime_ns
    assert main(["forget", "--config", str(config(tmp_path)), "--profile", "tuned"]) == 0
    assert "nothing remembered against profile tuned" in capsys.readouterr().out
    assert store.path.stat().st_mtime_ns == before  # left as it was


def test_an_unknown_profile_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    remember(tmp_path)
    assert main(["forget", "--config", str(config(tmp_path)), "--profile", "tunned"]) == 2
    assert "did you mean 'tuned'?" in capsys.readouterr().err


def test_a_broken_config_is_78(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: 3\n")
    assert main(["forget", "--config", str(bad)]) == 78
    assert "engine" in capsys.readouterr().err
