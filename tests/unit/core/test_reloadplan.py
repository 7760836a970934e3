"""reloadplan: which changed keys a reload cannot apply, and why (table-driven)."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.config import Config
from sglang_supervisor.core.reloadplan import changed_keys, refusal_reason, refused_keys

BASE = Config.model_validate({
    "engine": {"command": ["python3"], "model_path": "org/m", "args": {"tp-size": 2}},
    "profiles": [{"name": "a"}, {"name": "b"}],
})


def changed(**patch: object) -> Config:
    data = BASE.model_dump()
    for key, value in patch.items():
        node = data
        *parents, last = key.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return Config.model_validate(data)


@pytest.mark.parametrize(("patch", "engine_restarts", "refused"), [
    ({}, False, []),
    # applied at once
    ({"timeouts__health_interval_s": 3.0}, False, []),
    ({"probe__interval_s": 60.0}, False, []),
    ({"restart__known_bad_ttl_s": 60.0}, False, []),
    ({"remediation": {"default": "stop"}}, False, []),
    ({"engine__args": {"tp-size": 4}}, True, []),
    # fixed for the supervisor's run: refused even when the engine restarts
    ({"metrics__address": "127.0.0.1:9500"}, False, ["metrics.address"]),
    ({"metrics__enabled": False}, True, ["metrics.enabled"]),
    ({"state_dir": "/srv/state"}, False, ["state_dir"]),
    ({"name": "llama"}, True, ["name"]),
    ({"runtime_dir": "/run/x"}, False, ["runtime_dir"]),
    ({"logging__format": "json"}, False, ["logging.format"]),
    ({"gateway__url": "http://127.0.0.1:30080"}, False, ["gateway.url"]),
    # fixed for the running engine: applied only with an engine restart
    ({"engine__log_file": "/var/log/x.log"}, False, ["engine.log_file"]),
    ({"engine__log_file": "/var/log/x.log"}, True, []),
    ({"logging__forward_engine_output": False}, False, ["logging.forward_engine_output"]),
    ({"engine__log_backups": 1, "state_dir": "/srv"}, False, ["engine.log_backups", "state_dir"]),
])
def test_refused_keys(patch: dict[str, object], engine_restarts: bool, refused: list[str]) -> None:
    new = changed(**patch)
    got = refused_keys(BASE, new, engine_restarts=engine_restarts)
    assert sorted(got) == refused
    assert all(got.values())


def test_changed_keys_name_leaves_and_whole_flag_maps() -> None:
    new = changed(engine__args={"tp-size": 4, "x": 1}, timeouts__stall_s=5.0)
    assert changed_keys(BASE, new) == ["engine.args", "timeouts.stall_s"]


def test_the_reason_names_every_key_and_the_way_out() -> None:
    text = refusal_reason({"metrics.address": "bound at start", "state_dir": "opened at start"})
    assert text.startswith("metrics.address, state_dir changed")
    assert "restart the unit" in text
