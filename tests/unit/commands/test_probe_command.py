"""`sglang-supervisor probe`: argument errors, API key sources (never printed), report rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_supervisor import cli
from sglang_supervisor.commands import probe as cmd
from sglang_supervisor.shell.checks import probe as probe_mod


def _sse_engine(seen: dict[str, Any]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers.get("authorization")
        body = "".join(f'data: {{"text": "x", "meta_info": {{"completion_tokens": {i}}}}}\n\n'
                       for i in range(1, 9))
        return httpx.Response(200, content=(body + "data: [DONE]\n\n").encode())

    return httpx.MockTransport(handler)


@pytest.fixture
def mock_engine(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    real = httpx.AsyncClient

    def client(*args: Any, **kwargs: Any) -> httpx.AsyncClient:
        kwargs["transport"] = _sse_engine(seen)
        return real(*args, **kwargs)

    monkeypatch.setattr(probe_mod.httpx, "AsyncClient", client)
    return seen


def test_json_report_uses_key_file_and_never_prints_it(tmp_path: Path, mock_engine: dict[str, Any],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "key"
    key.write_text("s3cr3t-key\n")
    rc = cli.main(["probe", "--url", "http://engine:30000", "--max-new-tokens", "8", "--runs", "2",
                   "--concurrency", "2", "--api-key-file", str(key), "--json"])
    out = capsys.readouterr()
    assert rc == 0
    data = json.loads(out.out)
    assert data["ok"] == 4 and data["shape"]["name"] == "v1-in256-out8"
    assert mock_engine["auth"] == "Bearer s3cr3t-key"
    assert "s3cr3t" not in out.out + out.err


def test_env_key_and_text_report(mock_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SGLANG_API_KEY", "envkey")
    assert cli.main(["probe", "--url", "http://engine", "--max-new-tokens", "8", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "decode (per stream, median)" in out and "ok 1/1" in out
    assert mock_engine["auth"] == "Bearer envkey"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "engine:30000"], "must start with http"),
        (["--url", "http://e", "--max-new-tokens", "1"], "max_new_tokens >= 2"),
        (["--url", "http://e", "--runs", "0"], "--runs and --concurrency"),
        (["--url", "http://e", "--api-key-file", "/nonexistent/key"], "cannot read --api-key-file"),
    ],
)
def test_bad_arguments_are_usage_errors(argv: list[str], message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["probe", *argv]) == 2
    assert message in capsys.readouterr().err


def test_unreachable_server_is_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cmd.main(cli.build_parser().parse_args(
        ["probe", "--url", "http://127.0.0.1:9", "--runs", "1", "--timeout", "5"]))
    assert rc == 69
    assert "error:" in capsys.readouterr().out
