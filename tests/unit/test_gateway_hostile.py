"""A hostile gateway's answers, found by attacking what issue 14 landed: each is a typed answer,
never an exception out of the agent's background tasks or the drain before a stop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sglang_supervisor import gateway, rotation
from sglang_supervisor.config import GatewaySettings
from sglang_supervisor.fleet import RECORD_FILE, GatewayAgent, read_gateway_key

# Within the 1 MiB cap, deep enough that json.loads raises RecursionError (not a ValueError).
DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("parse", [gateway.parse_add, gateway.parse_workers])
def test_deeply_nested_json_is_garbage_not_an_exception(
        parse: Callable[[int, bytes], gateway.GatewayAnswer]) -> None:
    answer = parse(200, DEEP)
    assert not answer.ok
    assert answer.problem == "garbage"


def test_deeply_nested_json_under_the_worker_key_is_garbage() -> None:
    answer = gateway.parse_add(202, b'{"worker_id": ' + DEEP + b"}")
    assert (answer.ok, answer.problem) == (False, "garbage")


def test_a_deeply_nested_registration_record_is_no_record() -> None:
    # under the 4 KiB cap, deeper than json's recursion limit
    assert rotation.parse_registration(b"[" * 2000 + b"]" * 2000) is None


def test_a_damaged_registration_record_does_not_stop_the_agent_starting(tmp_path: Path) -> None:
    # gateway.json lives in the state dir: a crash here would crash-loop the unit at every start.
    (tmp_path / RECORD_FILE).write_bytes(b"[" * 3000)
    agent = GatewayAgent(GatewaySettings(url="http://127.0.0.1:9"), "http://127.0.0.1:30000",
                         str(tmp_path), CollectorRegistry(), api_key=None)
    agent.start()  # no stale registration to remove: nothing scheduled, nothing raised
    assert agent._stale_task is None


def test_a_gateway_key_too_short_to_redact_is_refused_with_the_fix(tmp_path: Path) -> None:
    # It is redacted from every log like the engine's key: "admin" would shred ordinary lines.
    key = tmp_path / "gw-key"
    key.write_text("admin\n")
    with pytest.raises(ValueError, match=r"5 characters long.*openssl rand"):
        read_gateway_key(str(key))
    key.write_text("0123456789abcdef\n")
    assert read_gateway_key(str(key)) == "0123456789abcdef"
