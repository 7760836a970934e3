"""grouplink.py: the leader's link endpoints (authenticated, untrusted reports) and the worker's
line checks."""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest
from structlog.testing import capture_logs

from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.group import GroupSettings, MemberFailed, Report, View, parse_view
from sglang_supervisor.core.linkauth import AUTH_HEADER, RejectReason, Stamp, sign, verify
from sglang_supervisor.core.logwatch import LogParser
from sglang_supervisor.shell.links.grouplink import LeaderLink, _NodeParser, local_capture_keys

SECRET = b"5ec7e7" * 8
G = {"nnodes": 2, "dist_init_addr": "127.0.0.1:5000", "link": "127.0.0.1:5001",
     "secret_file": "/etc/sglang-supervisor/group.secret"}
SETTINGS = GroupSettings.model_validate(G)
NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def make_link(settings: GroupSettings = SETTINGS, clock: Clock | None = None
              ) -> tuple[LeaderLink, list[MemberFailed]]:
    failures: list[MemberFailed] = []
    link = LeaderLink(settings, SECRET,
                      view=lambda: View(3, "fast", "starting", "group", dict(link.book.claimed)),
                      engine_running=lambda: True, on_failure=failures.append, clock=clock or Clock())
    link.book.new_generation(3)
    return link, failures


def signed_headers(body: bytes, *, node: int = 1, at: float = NOW, secret: bytes = SECRET,
                   nonce: str | None = None, purpose: str = "report", method: str = "POST",
                   path: str = "/group/report") -> dict[str, str]:
    stamp = Stamp(node, int(at * 1000), nonce or secrets.token_hex(16))
    return {AUTH_HEADER: sign(secret, purpose, method=method, path=path,  # type: ignore[arg-type]
                              stamp=stamp, body=body)}


async def send(link: LeaderLink, body: bytes, headers: dict[str, str] | None) -> httpx.Response:
    transport = httpx.ASGITransport(app=link.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://leader") as client:
        return await client.post("/group/report", content=body, headers=headers or {})


def post(link: LeaderLink, body: bytes, **sig: object) -> httpx.Response:
    """A report as a worker holding the group's secret sends it (signed now, fresh nonce)."""
    return asyncio.run(send(link, body, signed_headers(body, **sig)))  # type: ignore[arg-type]


def test_reports_are_bounded_and_typed() -> None:
    link, failures = make_link()
    for body in (b"x" * 100_000, b"{}", b'{"node_rank": 7, "instance": "a", "state": "idle"}'):
        resp = post(link, body)
        assert resp.status_code == 400 and resp.text == "refused: malformed\n"
    assert link.rejections[RejectReason.MALFORMED] == 3 and link.rejected == 3 and failures == []


def test_a_failed_worker_is_the_groups_failure_once() -> None:
    link, failures = make_link()
    ok = post(link, Report(1, "w1", 3, "starting").to_json())
    assert ok.status_code == 200 and parse_view(ok.content).claimed == {1: "w1"}
    bad = Report(1, "w1", 3, "failed", FailureClass.CAPTURE_OOM, "oom")
    post(link, bad.to_json())
    post(link, bad.to_json())  # reported again until the leader moves on: fallout
    assert [f.failure_class for f in failures] == [FailureClass.CAPTURE_OOM]


FORGED_FAILURE = Report(1, "w1", 3, "failed", FailureClass.CAPTURE_OOM, "oom").to_json()


@pytest.mark.parametrize(("case", "headers", "reason"), [
    ("no header at all", {}, RejectReason.UNAUTHENTICATED),
    ("an old-style bearer token", {AUTH_HEADER: "Bearer x"}, RejectReason.UNAUTHENTICATED),
    ("signed with another secret", signed_headers(FORGED_FAILURE, secret=b"x" * 32), RejectReason.FORGED),
    ("signed for another body", signed_headers(b"{}"), RejectReason.FORGED),
    ("signed as a GET", signed_headers(FORGED_FAILURE, purpose="get"), RejectReason.FORGED),
    ("signed by node 0, a leader's stamp", signed_headers(FORGED_FAILURE, node=0), RejectReason.WRONG_NODE),
    ("a valid MAC from long ago", signed_headers(FORGED_FAILURE, at=NOW - 3600), RejectReason.STALE),
])
def test_a_forged_failure_report_changes_nothing(case: str, headers: dict[str, str],
                                                 reason: RejectReason) -> None:
    link, failures = make_link()
    post(link, Report(1, "w1", 3, "serving").to_json())  # the real worker, serving
    resp = asyncio.run(send(link, FORGED_FAILURE, headers))
    assert resp.status_code == 401, case
    assert resp.text == f"refused: {reason.value}\n"  # the reason's word, nothing of the group
    assert AUTH_HEADER not in resp.headers and "w1" not in resp.text
    assert failures == [] and not link.book.failed and link.book.serving == {1}
    assert link.rejections[reason] == 1


def test_a_replayed_report_is_refused_within_the_window() -> None:
    link, failures = make_link()
    body = Report(1, "w1", 3, "starting").to_json()
    headers = signed_headers(body)
    assert asyncio.run(send(link, body, headers)).status_code == 200
    again = asyncio.run(send(link, body, headers))
    assert again.status_code == 401 and again.text == "refused: replayed\n"
    assert link.rejections[RejectReason.REPLAYED] == 1 and failures == []


def test_a_node_cannot_report_for_another_node() -> None:
    link, failures = make_link(SETTINGS.model_copy(update={"nnodes": 3}))
    body = Report(1, "w1", 3, "failed", FailureClass.CAPTURE_OOM, "oom").to_json()
    resp = post(link, body, node=2)
    assert resp.status_code == 401 and resp.text == "refused: wrong_node\n"
    assert failures == [] and link.book.claimed == {}


def test_the_view_is_signed_for_the_report_it_answers() -> None:
    link, _ = make_link()
    body = Report(1, "w1", 3, "starting").to_json()
    headers = signed_headers(body, nonce="ab" * 16)
    resp = asyncio.run(send(link, body, headers))
    leader = verify(SECRET, resp.headers[AUTH_HEADER], "view", method="POST", path="/group/report",
                    body=resp.content, bound="ab" * 16)
    assert leader.node == 0
    with pytest.raises(ValueError, match="MAC"):  # an answer to another request is no answer to ours
        verify(SECRET, resp.headers[AUTH_HEADER], "view", method="POST", path="/group/report",
               body=resp.content, bound="cd" * 16)


async def get_view(link: LeaderLink, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=link.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://leader") as client:
        return await client.get("/group", headers=headers)


def test_get_group_shows_nothing_to_a_caller_without_the_secret() -> None:
    link, _ = make_link()
    post(link, Report(1, "w1-instance", 3, "serving").to_json())
    for headers in ({}, signed_headers(b"", purpose="get", method="GET", path="/group", secret=b"y" * 32)):
        resp = asyncio.run(get_view(link, headers))
        assert resp.status_code == 401
        assert "w1-instance" not in resp.text and "fast" not in resp.text and "generation" not in resp.text
    ok = asyncio.run(get_view(link, signed_headers(b"", node=0, purpose="get", method="GET", path="/group")))
    assert ok.status_code == 200 and parse_view(ok.content).claimed == {1: "w1-instance"}


def test_a_flood_of_forged_reports_is_counted_each_and_logged_once_a_minute() -> None:
    clock = Clock()
    link, failures = make_link(clock=clock)

    async def flood(n: int) -> None:
        transport = httpx.ASGITransport(app=link.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://leader") as client:
            for _ in range(n):
                await client.post("/group/report", content=FORGED_FAILURE,
                                  headers=signed_headers(FORGED_FAILURE, secret=b"z" * 32))

    with capture_logs() as logs:
        asyncio.run(flood(200))
        clock.now += 61
        asyncio.run(flood(1))
    lines = [e for e in logs if e["event"] == "group.link_rejected"]
    assert [(e["reason"], e["held_back"]) for e in lines] == [("forged", 0), ("forged", 199)]
    assert link.rejections[RejectReason.FORGED] == 201 and failures == []


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
    link = LeaderLink(SETTINGS, SECRET, view=lambda: View(3, "fast", "starting", "group", {}),
                      engine_running=lambda: True, on_failure=lambda f: None,
                      on_progress=lambda: moves.append(1), clock=Clock())
    link.book.new_generation(3)
    for captures in (0, 0, 1, 1, 2):
        post(link, Report(1, "w1", 3, "starting", None, "", captures, 2).to_json())
    post(link, Report(1, "w1", 2, "starting", None, "", 5, 5).to_json())  # old generation
    assert len(moves) == 3


def test_the_groups_state_is_exported_for_prometheus() -> None:
    from prometheus_client import CollectorRegistry

    from sglang_supervisor.shell.links.grouplink import GroupCollector

    link, _ = make_link()
    registry = CollectorRegistry()
    registry.register(GroupCollector(link))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("sglang_supervisor_group_generation") == 3
    assert sample("sglang_supervisor_group_nodes") == 2
    assert sample("sglang_supervisor_group_node_serving", node_rank="1") == 0
    assert sample("sglang_supervisor_group_link_rejected_total", reason="forged") == 0
    post(link, Report(1, "w1", 3, "serving").to_json())
    post(link, b"not a report")
    post(link, FORGED_FAILURE, secret=b"q" * 32)
    assert sample("sglang_supervisor_group_node_serving", node_rank="1") == 1
    assert sample("sglang_supervisor_group_rejected_reports") == 2
    assert sample("sglang_supervisor_group_link_rejected_total", reason="malformed") == 1
    assert sample("sglang_supervisor_group_link_rejected_total", reason="forged") == 1
    assert sample("sglang_supervisor_group_failed") == 0
    post(link, Report(1, "w1", 3, "failed", FailureClass.CAPTURE_OOM, "oom").to_json())
    assert sample("sglang_supervisor_group_failed") == 1
