"""An API key the supervisor cannot send is refused where it is read, not discovered by the first
HTTP call: httpx encodes header values as ASCII, so a key with `é` raised UnicodeEncodeError (a
ValueError none of the HTTP error handlers catch) -- building the gateway client at start, and in
every probe and health check of an engine with such a key."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sglang_supervisor.apikey import read_api_key
from sglang_supervisor.config import ConfigError, EngineSettings
from sglang_supervisor.fleet import read_gateway_key
from sglang_supervisor.secretforms import api_key_problem

BAD = ["sk-0123456789abcdef-é", "sk-0123456789abcdef\x01x", "sk-0123456789abcdef\x7fx",
       "sk-0123456789\tabcdef"]


def test_the_premise_httpx_cannot_send_a_non_ascii_key() -> None:
    with pytest.raises(UnicodeEncodeError):
        httpx.AsyncClient(headers={"Authorization": f"Bearer {BAD[0]}"})


@pytest.mark.parametrize("key", BAD)
def test_a_key_that_is_not_printable_ascii_is_refused(key: str) -> None:
    problem = api_key_problem(key)
    assert problem is not None and "printable ASCII" in problem
    assert key not in problem


def test_printable_ascii_keys_with_quotes_and_symbols_are_fine() -> None:
    assert api_key_problem("sk-'q\"b\\s+l/a=s%h&-0123456789") is None


@pytest.mark.parametrize("key", BAD[:2])
def test_both_key_files_refuse_it(tmp_path: Path, key: str) -> None:
    f = tmp_path / "key"
    f.write_text(key + "\n", encoding="utf-8")
    f.chmod(0o600)
    with pytest.raises(ValueError, match="printable ASCII"):
        read_gateway_key(str(f))
    with pytest.raises(ConfigError) as info:
        read_api_key(EngineSettings(command=["python3"], model_path="/m", api_key_file=str(f)))  # type: ignore[arg-type]
    assert "printable ASCII" in str(info.value.problems[0])
