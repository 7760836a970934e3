"""grouplink.py: the leader's link endpoints (untrusted reports) and the worker's line checks."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.group import GroupSettings, MemberFailed, Report, View, parse_view
from sglang_supervisor.core.logwatch import LogParser
from sglang_supervisor.shell.grouplink import LeaderLink, _NodeParser, local_capture_keys

SETTINGS = GroupSettings.model_validate({"nnodes": 2, "dist_init_addr": "127.0.0.1:5000",
                                         "link": "127.0.0.1:5001"})


def make_link() -> tuple[LeaderLink, list[MemberFailed]]:
    failures: list[MemberFailed] = []
    link = LeaderLink(SETTINGS, lambda: View(3, "fast", "starting", "group", dict(link.book.claimed)),
                      lambda: True, failures.append)
    link.book.new_generation(3)
    return link, failures


async def post(link: LeaderLink, body: bytes) -> httpx.Response:
    transport = httpx.ASGITransport(app=link.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://leader") as client:
        return await client.post("/group/report", content=body)


def test_reports_are_bounded_and_typed() -> None:
    link, failures = make_link()
    for body in (b"x" * 100_000, b"{}", b'{"node_rank": 7, "instance": "a", "state": "idle"}'):
        resp = asyncio.run(post(link, body))
        assert resp.status_code == 400 and resp.text.startswith("bad report:")
    assert link.rejected == 3 and failures == []


def test_a_failed_worker_is_the_groups_failure_once() -> None:
    link, failures = make_link()
    ok = asyncio.run(post(link, Report(1, "w1", 3, "starting").to_json()))
    assert ok.status_code == 200 and parse_view(ok.content).claimed == {1: "w1"}
    bad = Report(1, "w1", 3, "failed", FailureClass.CAPTURE_OOM, "oom")
    asyncio.run(post(link, bad.to_json()))
    asyncio.run(post(link, bad.to_json()))  # reported again until the leader moves on: fallout
    assert [f.failure_class for f in failures] == [FailureClass.CAPTURE_OOM]


def test_the_leader_expects_only_its_own_ranks_captures() -> None:
    keys = frozenset({("target", "decode", "TP0"), ("target", "decode", "TP1"), ("draft", "decode", "TP0")})
    assert local_capture_keys(keys, SETTINGS, 2) == {("target", "decode", "TP0"), ("draft", "decode", "TP0")}
    worker = SETTINGS.model_copy(update={"node_rank": 1})
    assert local_capture_keys(keys, worker, 2) == {("target", "decode", "TP1")}


def test_the_dummy_server_line_marks_the_node_up_only_as_a_log_line() -> None:
    p = _NodeParser(LogParser("0.5.23"))
    p.feed_line('[2026-12-01 10:00:00 TP1] prompt: "Starting dummy health check server at x:1"')
    p.feed_line('[2026-12-01 10:00:00 TP1] prompt: "Dummy health check server started in background '
                'thread at x:1"')
    assert not p.dummy_seen
    p.feed_line("[2026-12-01 10:00:01] Dummy health check server started in background thread at "
                "0.0.0.0:30000")
    assert p.dummy_seen


# The worker launcher's line as each release logs it (sglang/srt/utils/common.py
# launch_dummy_health_check_server of the released wheels; 0.5.12+ writes the address with
# NetworkAddress.to_host_port_str, IPv6 in brackets).
WORKER_READY_LINES = [
    ("0.5.3", "Starting dummy health check server at 0.0.0.0:30000"),
    ("0.5.3", "Dummy health check server scheduled on existing loop at 0.0.0.0:30000"),
    ("0.5.4", "Starting dummy health check server at 0.0.0.0:30000"),
    ("0.5.4", "Dummy health check server scheduled on existing loop at 0.0.0.0:30000"),
    ("0.5.5", "Dummy health check server started in background thread at 0.0.0.0:30000"),
    ("0.5.9", "Dummy health check server started in background thread at 10.0.0.2:30000"),
    ("0.5.12", "Dummy health check server started in background thread at [::]:30000"),
    ("0.5.13", "Dummy health check server started in background thread at 0.0.0.0:30000"),
    ("0.5.14", "Dummy health check server started in background thread at 0.0.0.0:30000"),
    ("0.5.17", "Dummy health check server started in background thread at 0.0.0.0:30000"),
    ("0.5.23", "Dummy health check server started in background thread at [fd00::2]:30000"),
]


@pytest.mark.parametrize(("version", "message"), WORKER_READY_LINES,
                         ids=[f"{v}-{m.split(' at ')[0][:40]}" for v, m in WORKER_READY_LINES])
def test_every_releases_worker_ready_line_marks_the_node_up(version: str, message: str) -> None:
    p = _NodeParser(LogParser(version))
    p.feed_line(f"[2026-12-01 10:00:01] {message}")
    assert p.dummy_seen


@pytest.mark.parametrize("message", [
    "Dummy health check server stopped at 0.0.0.0:30000",
    "Dummy health check server failed to start: [Errno 98] Address already in use",
])
def test_the_dummy_server_gone_is_not_the_node_up(message: str) -> None:
    """Logged when its thread ends (0.5.5+): the node is not serving."""
    p = _NodeParser(LogParser("0.5.23"))
    p.feed_line(f"[2026-12-01 10:00:01] {message}")
    assert not p.dummy_seen


def test_worker_progress_keeps_the_leaders_stall_timer_alive_once_per_change() -> None:
    moves: list[int] = []
    link = LeaderLink(SETTINGS, lambda: View(3, "fast", "starting", "group", {}), lambda: True,
                      lambda f: None, lambda: moves.append(1))
    link.book.new_generation(3)
    for captures in (0, 0, 1, 1, 2):
        asyncio.run(post(link, Report(1, "w1", 3, "starting", None, "", captures, 2).to_json()))
    asyncio.run(post(link, Report(1, "w1", 2, "starting", None, "", 5, 5).to_json()))  # old generation
    assert len(moves) == 3


def test_the_groups_state_is_exported_for_prometheus() -> None:
    from prometheus_client import CollectorRegistry

    from sglang_supervisor.shell.grouplink import GroupCollector

    link, _ = make_link()
    registry = CollectorRegistry()
    registry.register(GroupCollector(link))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("sglang_supervisor_group_generation") == 3
    assert sample("sglang_supervisor_group_nodes") == 2
    assert sample("sglang_supervisor_group_node_serving", node_rank="1") == 0
    asyncio.run(post(link, Report(1, "w1", 3, "serving").to_json()))
    asyncio.run(post(link, b"not a report"))
    assert sample("sglang_supervisor_group_node_serving", node_rank="1") == 1
    assert sample("sglang_supervisor_group_rejected_reports") == 1
    assert sample("sglang_supervisor_group_failed") == 0
    asyncio.run(post(link, Report(1, "w1", 3, "failed", FailureClass.CAPTURE_OOM, "oom").to_json()))
    assert sample("sglang_supervisor_group_failed") == 1
