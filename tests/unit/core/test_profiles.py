"""Rendering profiles into SGLang command lines, per engine version."""

from __future__ import annotations

import shlex
import stat
import sys
from pathlib import Path

import pytest

from sglang_supervisor.core.config import ConfigError, parse_config
from sglang_supervisor.core.profiles import (
    REDACTED,
    command_hash,
    config_problems,
    default_secret_config_path,
    flag_tokens,
    redact_argv,
    render,
    render_all,
    shell_format,
)
from sglang_supervisor.engine.detect import detect_engine_version, engine_interpreter
from sglang_supervisor.shell.engineproc.apikey import read_api_key
from sglang_supervisor.shell.files.configfile import load_config

REPO = Path(__file__).resolve().parents[3]
QWEN = REPO / "etc" / "sglang-supervisor" / "qwen.yaml"
REMOVED_IN_0520 = ["--enforce-piecewise-cuda-graph", "--disable-piecewise-cuda-graph",
                   "--mamba-scheduler-strategy", "--cuda-graph-max-bs", "--cuda-graph-bs"]

BASE = """\
engine:
  command: ["{python}", -m, sglang.launch_server]
  version: "0.5.23"
  model_path: org/m
  port: 31000
  args:
    tp-size: 2
    trust-remote-code: true
    disable-radix-cache: false
    chunked-prefill-size: null
    mem-fraction-static: 0.88
  env:
    FOO: bar
profiles:
  - name: first
    args:
      cuda-graph-bs-decode: [1, 2, 4]
  - name: second
    remove: [mem-fraction-static]
    env: {BAR: "x y"}
"""


def flags_with_values(argv: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for tok in argv:
        if tok.startswith("--"):
            current = tok
            out[current] = []
        elif current is not None:
            out[current].append(tok)
    return out


@pytest.fixture
def qwen():
    return load_config(QWEN)


def test_qwen_tuned_on_0523_migrates_the_seed_flags(qwen) -> None:
    rc = render(qwen, "tuned", "0.5.23")
    flags = flags_with_values(rc.argv)
    assert flags["--cuda-graph-backend-prefill"] == ["breakable"]
    assert flags["--mamba-radix-cache-strategy"] == ["extra_buffer"]
    for removed in REMOVED_IN_0520:
        assert removed not in rc.argv
    assert "SGLANG_ENABLE_SPEC_V2" not in rc.env
    assert rc.errors == []
    assert any(w.flag == "SGLANG_ENABLE_SPEC_V2" for w in rc.warnings)
    olds = {m.old for m in rc.migrations}
    assert "--enforce-piecewise-cuda-graph" in olds
    assert "--mamba-scheduler-strategy extra_buffer" in olds


def test_qwen_every_profile_on_0523_has_no_removed_flag(qwen) -> None:
    for rc in render_all(qwen, "0.5.23"):
        assert rc.errors == [], (rc.profile, rc.errors)
        assert not set(REMOVED_IN_0520) & set(rc.argv), rc.profile
        assert "SGLANG_ENABLE_SPEC_V2" not in rc.env


def test_qwen_tuned_on_0513_keeps_the_seed_flags(qwen) -> None:
    rc = render(qwen, "tuned", "0.5.13")
    assert "--enforce-piecewise-cuda-graph" in rc.argv
    assert flags_with_values(rc.argv)["--mamba-scheduler-strategy"] == ["extra_buffer"]
    assert rc.env["SGLANG_ENABLE_SPEC_V2"] == "1"
    assert "--cuda-graph-backend-prefill" not in rc.argv


def test_qwen_fallbacks_on_0513_use_the_old_names(qwen) -> None:
    flags = flags_with_values(render(qwen, "low-mem", "0.5.13").argv)
    assert "--disable-piecewise-cuda-graph" in flags
    assert flags["--cuda-graph-max-bs"] == ["8"]


def test_qwen_ladder_shape(qwen) -> None:
    spec = "--speculative-algorithm"
    assert spec not in render(qwen, "no-spec", "0.5.23").argv
    eager = flags_with_values(render(qwen, "eager", "0.5.23").argv)
    assert eager["--cuda-graph-backend-decode"] == ["disabled"]
    assert eager["--cuda-graph-backend-prefill"] == ["disabled"]
    assert spec not in eager
    low = flags_with_values(render(qwen, "low-mem", "0.5.23").argv)
    assert low["--mem-fraction-static"] == ["0.8"]
    assert low["--cuda-graph-backend-prefill"] == ["disabled"]  # extends no-prefill-graph
    tuned = render(qwen, "tuned", "0.5.23").argv
    assert tuned[:3] == ["/opt/sglang/.venv/bin/python3", "-m", "sglang.launch_server"]
    assert flags_with_values(tuned)["--model-path"] == ["Qwen/Qwen3.6-27B"]
    assert flags_with_values(tuned)["--host"] == ["127.0.0.1"]
    assert flags_with_values(tuned)["--port"] == ["30000"]
    assert flags_with_values(tuned)["--tp-size"] == ["2"]


def test_flag_tokens() -> None:
    assert flag_tokens("trust-remote-code", True) == ["--trust-remote-code"]
    assert flag_tokens("x", False) == []
    assert flag_tokens("x", None) == []
    assert flag_tokens("tp-size", 2) == ["--tp-size", "2"]
    assert flag_tokens("m", 0.88) == ["--m", "0.88"]
    assert flag_tokens("bs", [1, 2, "4"]) == ["--bs", "1", "2", "4"]


def test_render_overlay_python_placeholder_and_order() -> None:
    config = parse_config(BASE, "t")
    rc = render(config, "first", "0.5.23", python="/usr/bin/python3.11")
    assert rc.argv[:3] == ["/usr/bin/python3.11", "-m", "sglang.launch_server"]
    assert rc.argv[3:9] == ["--model-path", "org/m", "--host", "127.0.0.1", "--port", "31000"]
    flags = flags_with_values(rc.argv)
    assert flags["--cuda-graph-bs-decode"] == ["1", "2", "4"]
    assert "--disable-radix-cache" not in flags and "--chunked-prefill-size" not in flags
    assert flags["--trust-remote-code"] == []
    assert list(flags)[-1] == "--cuda-graph-bs-decode"  # additions come after the base flags
    assert rc.env == {"FOO": "bar"}
    second = render(config, "second", "0.5.23")
    assert "--mem-fraction-static" not in second.argv
    assert second.env == {"FOO": "bar", "BAR": "x y"}
    assert second.secret_config is None


def test_unknown_profile_is_a_config_error_listing_names() -> None:
    config = parse_config(BASE, "t")
    with pytest.raises(ConfigError) as info:
        render(config, "frist", "0.5.23")
    assert "'first'" in info.value.problems[0].fix
    assert "second" in info.value.problems[0].fix


def test_flag_without_equivalent_is_an_error_with_its_key_path() -> None:
    text = BASE.replace("    tp-size: 2\n", "    tp-size: 2\n    speculative-algorithm: MTP\n")
    text = text.replace("      cuda-graph-bs-decode: [1, 2, 4]\n",
                        "      cuda-graph-bs-decode: [1, 2, 4]\n      collect-tokens-histogram: true\n")
    config = parse_config(text, "t")
    rc = render(config, "first", "0.5.23")
    problems = {p.path: p for p in config_problems(config, rc, "0.5.23")}
    assert "engine.args.speculative-algorithm" in problems
    assert "NEXTN" in problems["engine.args.speculative-algorithm"].fix
    assert "profiles[0].args.collect-tokens-histogram" in problems


def test_api_key_goes_into_the_secret_config_never_argv_or_env(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-very-secret-key-42\n")
    key.chmod(0o600)
    config = parse_config(BASE.replace("  model_path:", f"  api_key_file: {key}\n  model_path:"), "t")
    with pytest.raises(ValueError, match="api_key"):  # core reads no key file: the shell passes it
        render(config, "first", "0.5.23", secret_config_path="/run/sglang/x.yaml")
    rc = render(config, "first", "0.5.23", secret_config_path="/run/sglang/x.yaml",
                api_key=read_api_key(config.engine))
    assert rc.argv[-2:] == ["--config", "/run/sglang/x.yaml"]
    assert rc.secret_config == {"api-key": "sk-very-secret-key-42"}
    assert "sk-very-secret-key-42" not in " ".join(rc.argv)
    assert "sk-very-secret-key-42" not in " ".join(rc.env.values())
    assert "sk-very-secret-key-42" not in shell_format(rc)
    assert "sk-very-secret-key-42" not in str(rc.to_json())
    shown = render(config, "first", "0.5.23", api_key=REDACTED, secret_config_path="/run/sglang/x.yaml")
    assert shown.secret_config == {"api-key": REDACTED}
    assert command_hash(shown) == command_hash(rc)


def test_default_secret_config_path() -> None:
    config = parse_config(BASE, "t")
    assert default_secret_config_path(config, {}) == "/var/lib/sglang-supervisor/sglang-engine-secrets.yaml"
    path = default_secret_config_path(config, {"RUNTIME_DIRECTORY": "/run/sglang-qwen"})
    assert path == "/run/sglang-qwen/sglang-engine-secrets.yaml"
    pinned = parse_config(BASE + "runtime_dir: /run/x\n", "t")
    assert default_secret_config_path(pinned, {"RUNTIME_DIRECTORY": "/run/y"}).startswith("/run/x/")


def test_shell_format_is_copy_pasteable_and_redacted() -> None:
    config = parse_config(BASE.replace("    FOO: bar\n", "    FOO: bar\n    HF_TOKEN: hf_abc\n"), "t")
    rc = render(config, "second", "0.5.23", python="/venv/bin/python3")
    text = shell_format(rc)
    lines = text.splitlines()
    assert lines[0] == "FOO=bar \\"
    assert lines[1] == f"  HF_TOKEN={shlex.quote(REDACTED)} \\"
    assert "hf_abc" not in text
    assert "  /venv/bin/python3 -m sglang.launch_server \\" in lines
    assert "  --tp-size 2 \\" in lines
    assert lines[-1].startswith("  --") and not lines[-1].endswith("\\")
    tokens = shlex.split(text.replace("\\\n", " "))
    env_part = [t for t in tokens if "=" in t and not t.startswith("-")]
    assert env_part == ["FOO=bar", f"HF_TOKEN={REDACTED}", "BAR=x y"]
    assert tokens[len(env_part):] == rc.argv


def test_redact_argv() -> None:
    assert redact_argv(["x", "--api-key", "k", "--port", "1"]) == ["x", "--api-key", REDACTED, "--port", "1"]
    assert redact_argv(["--api-key=k"]) == [f"--api-key={REDACTED}"]


def test_command_hash_is_stable_and_sensitive() -> None:
    config = parse_config(BASE, "t")
    a = render(config, "first", "0.5.23", python="/p")
    assert command_hash(a) == command_hash(render(config, "first", "0.5.23", python="/p"))
    assert len(command_hash(a)) == 64
    assert command_hash(a) != command_hash(render(config, "second", "0.5.23", python="/p"))
    assert command_hash(a) != command_hash(render(config, "first", "0.5.23", python="/q"))


def test_to_json_shape(qwen) -> None:
    doc = render(qwen, "tuned", "0.5.23").to_json()
    assert set(doc) >= {"profile", "argv", "env", "migrations"}
    assert doc["profile"] == "tuned"
    assert all(set(m) == {"old", "new", "since", "note"} for m in doc["migrations"])


# ---- engine version detection ---------------------------------------------------------------


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _auto(command: str, extra: str = "") -> str:
    return BASE.replace('version: "0.5.23"', "version: auto").replace(
        'command: ["{python}", -m, sglang.launch_server]', f"command: [{command}, -m, sglang.launch_server]"
    ) + extra


def test_detect_pinned_version_asks_nothing() -> None:
    assert detect_engine_version(parse_config(BASE, "t")) == "0.5.23"


def test_detect_asks_the_engine_interpreter(tmp_path: Path) -> None:
    python = _script(tmp_path / "python3", 'echo 0.5.17\n')
    assert detect_engine_version(parse_config(_auto(python), "t")) == "0.5.17"


def test_detect_with_a_console_script_uses_the_python_beside_it(tmp_path: Path) -> None:
    _script(tmp_path / "python3", 'echo 0.5.22\n')
    sglang = _script(tmp_path / "sglang", "exit 3\n")
    config = parse_config(_auto(sglang), "t")
    assert engine_interpreter(config) == str(tmp_path / "python3")
    assert detect_engine_version(config) == "0.5.22"


def test_detect_failures_are_config_errors(tmp_path: Path) -> None:
    missing = parse_config(_auto(str(tmp_path / "nope" / "python3")), "t")
    with pytest.raises(ConfigError) as info:
        detect_engine_version(missing)
    assert info.value.problems[0].path == "engine.version"
    assert "does not exist" in info.value.problems[0].problem
    broken = _script(tmp_path / "python3",
                     'echo "importlib.metadata.PackageNotFoundError: sglang" >&2; exit 1\n')
    with pytest.raises(ConfigError) as info:
        detect_engine_version(parse_config(_auto(broken), "t"))
    assert "not installed" in info.value.problems[0].problem
    assert "pip install sglang" in info.value.problems[0].fix


def test_detect_real_interpreter_without_sglang_is_a_config_error() -> None:
    config = parse_config(_auto(sys.executable), "t")
    try:
        version = detect_engine_version(config)
    except ConfigError as exc:
        assert exc.problems[0].path == "engine.version"
    else:  # this venv happens to have sglang installed (compat tier)
        assert version[0].isdigit()


def test_detect_simulator_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGLANG_SIM_VERSION", raising=False)
    sim = BASE.replace('version: "0.5.23"', "version: auto").replace(
        "[\"{python}\", -m, sglang.launch_server]", "[\"{python}\", -m, sglang_supervisor.simulator]")
    assert detect_engine_version(parse_config(sim, "t")) == "0.5.23"
    monkeypatch.setenv("SGLANG_SIM_VERSION", "0.5.17")
    assert detect_engine_version(parse_config(sim, "t")) == "0.5.17"
    pinned = sim.replace("    FOO: bar\n", "    FOO: bar\n    SGLANG_SIM_VERSION: '0.5.13'\n")
    assert detect_engine_version(parse_config(pinned, "t")) == "0.5.13"
