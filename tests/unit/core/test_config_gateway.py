"""The optional `gateway:` section: off by default, URLs checked, the key file held to the same
rules as the engine's (absolute, readable, not world-readable), and a key file the supervisor
cannot use is a configuration error (exit 78), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sglang_supervisor.core.config import Config, ConfigError, parse_config
from sglang_supervisor.shell.files.configfile import parse_checked
from sglang_supervisor.shell.supervisor import gateway_key

BASE = {"engine": {"command": ["python3", "-m", "sglang.launch_server"], "model_path": "org/m"},
        "profiles": [{"name": "first"}]}


def config(**gateway: object) -> str:
    return yaml.safe_dump({**BASE, "gateway": gateway})


def problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_checked(text, "t.yaml")
    return [(p.path, p.problem) for p in info.value.problems]


def test_off_by_default() -> None:
    c = Config.model_validate(BASE)
    assert not c.gateway.enabled and c.gateway.url is None
    assert gateway_key(c) is None


def test_urls_are_checked_and_normalised() -> None:
    c = parse_config(config(url="http://10.0.0.5:30080/", advertise_url="http://10.0.0.2:30000"), "t")
    assert c.gateway.url == "http://10.0.0.5:30080" and c.gateway.enabled
    [(path, problem)] = problems(config(url="10.0.0.5:30080"))
    assert path == "gateway.url" and "http(s) URL" in problem
    assert problems(config(url="http://gw", drain_s=-1))[0][0] == "gateway.drain_s"


def test_the_key_file_follows_the_engine_key_rules(tmp_path: Path) -> None:
    key = tmp_path / "gw-key"
    key.write_text("secret-0123456789abcdef\n")
    key.chmod(0o644)
    [(path, problem)] = problems(config(url="http://gw:1", api_key_file=str(key)))
    assert path == "gateway.api_key_file" and "readable by every user" in problem
    key.chmod(0o600)
    c = parse_config(config(url="http://gw:1", api_key_file=str(key)), "t")
    assert gateway_key(c) == "secret-0123456789abcdef"
    assert problems(config(url="http://gw:1", api_key_file="relative/key"))[0][0] == "gateway.api_key_file"


def test_an_unusable_key_is_a_configuration_error(tmp_path: Path) -> None:
    key = tmp_path / "gw-key"
    key.write_text("two\nlines\n")
    key.chmod(0o600)
    c = parse_config(config(url="http://gw:1", api_key_file=str(key)), "t")
    with pytest.raises(ConfigError) as info:
        gateway_key(c)
    assert info.value.problems[0].path == "gateway.api_key_file"
    assert "one line" in info.value.problems[0].problem


def test_credentials_in_a_gateway_url_are_refused() -> None:
    # The URLs are printed in every gateway log line and in /status: a password there would leak.
    for key in ("url", "advertise_url"):
        gw = {"url": "http://gw:1", key: "http://admin:s3cret-s3cret-s3cret@10.0.0.5:30080"}
        [(path, problem)] = problems(config(**gw))
        assert path == f"gateway.{key}" and "credentials" in problem
        assert "s3cret" not in problem
