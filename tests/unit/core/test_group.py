"""group.py: the multi-node group's settings, link messages and decisions (pure)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.group import (
    ExitGroup,
    Follow,
    GroupSettings,
    LeaderBook,
    MessageError,
    Report,
    StopLocal,
    View,
    Wait,
    group_flags,
    node_rank_labels,
    parse_report,
    parse_view,
    with_node_rank,
    worker_decide,
)

G = {"nnodes": 2, "dist_init_addr": "10.0.0.1:5000", "link": "10.0.0.1:9402",
     "secret_file": "/etc/sglang-supervisor/group.secret"}
NO_SECRET = {k: v for k, v in G.items() if k != "secret_file"}


def test_flags_are_sglangs() -> None:
    s = GroupSettings.model_validate({**G, "node_rank": 1})
    assert group_flags(s) == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"]


@pytest.mark.parametrize(("extra", "needle"), [
    ({"node_rank": 2}, "must be below group.nnodes"),
    ({"link": "10.0.0.1"}, "is not HOST:PORT"),
    ({"link": "10.0.0.1:5000"}, "different ports"),
    ({"secret_file": "group.secret"}, "relative path"),
    ({"secret_credential": "group-secret"}, "both set"),
    ({"secret_file": None, "secret_credential": "a/b"}, "not a credential name"),
])
def test_bad_settings_say_why(extra: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        GroupSettings.model_validate({**G, **extra})


def test_a_group_without_a_secret_is_refused_with_the_way_to_make_one() -> None:
    with pytest.raises(ValidationError) as err:
        GroupSettings.model_validate(NO_SECRET)
    text = str(err.value)
    assert "group.secret_file" in text and "openssl rand -hex 32" in text
    assert GroupSettings.model_validate({**NO_SECRET, "secret_credential": "group-secret"}).leader


def test_node_rank_from_the_environment() -> None:
    s = GroupSettings.model_validate(G)
    assert with_node_rank(s, {"SGLANG_SUPERVISOR_NODE_RANK": "1"}).node_rank == 1
    assert with_node_rank(s, {}).node_rank == 0
    with pytest.raises(ValueError, match="SGLANG_SUPERVISOR_NODE_RANK='x'"):
        with_node_rank(s, {"SGLANG_SUPERVISOR_NODE_RANK": "x"})
    with pytest.raises(ValidationError):
        with_node_rank(s, {"SGLANG_SUPERVISOR_NODE_RANK": "5"})


def test_rank_labels_are_global() -> None:
    assert node_rank_labels(4, 2, 1) == {"TP2", "TP3"}
    assert node_rank_labels(2, 2, 0) == {"TP0"}


def test_report_round_trip_and_hostile_input() -> None:
    r = Report(1, "abc", 3, "failed", FailureClass.CAPTURE_OOM, "oom", 2, 4)
    assert parse_report(r.to_json(), 2) == r
    for raw, needle in [
        (b"x" * 5000, "exceeds"),
        (b"\xff", "not JSON"),
        (b"[]", "object"),
        (b'{"node_rank": 0, "instance": "a", "state": "idle"}', "node_rank"),
        (b'{"node_rank": 1, "instance": "a", "state": "boom"}', "state"),
        (b'{"node_rank": 1, "instance": "", "state": "idle"}', "instance"),
        (b'{"node_rank": true, "instance": "a", "state": "idle"}', "node_rank"),
    ]:
        with pytest.raises(MessageError, match=needle):
            parse_report(raw, 2)
    odd = parse_report(b'{"node_rank": 1, "instance": "a", "state": "failed", "failure_class": "new"}', 2)
    assert odd.failure_class is FailureClass.OTHER


def test_view_round_trip_and_hostile_input() -> None:
    v = View(4, "fast", "starting", "group", {1: "abc"})
    assert parse_view(v.to_json()) == v
    with pytest.raises(MessageError, match="engine"):
        parse_view(b'{"generation": 1, "profile": "p", "engine": "x", "restart": "group"}')
    with pytest.raises(MessageError, match="claimed"):
        parse_view(b'{"generation": 1, "profile": "p", "engine": "none", "restart": "group", '
                   b'"claimed": {"a": 1}}')


def test_leader_book_gates_on_every_worker_serving() -> None:
    book = LeaderBook(nnodes=3)
    book.new_generation(1)
    assert book.on_report(Report(1, "a", 1, "serving"), True) is None
    assert not book.all_serving() and book.missing() == [2]
    assert book.on_report(Report(2, "b", 1, "serving"), True) is None
    assert book.all_serving()


def test_leader_book_failures() -> None:
    book = LeaderBook(nnodes=2)
    book.new_generation(1)
    book.on_report(Report(1, "a", 1, "starting"), True)
    failed = book.on_report(Report(1, "a", 1, "failed", FailureClass.CAPTURE_OOM, "oom"), True)
    assert failed is not None and failed.failure_class is FailureClass.CAPTURE_OOM
    assert book.on_report(Report(1, "a", 1, "failed", FailureClass.OTHER), True) is None  # fallout
    book.new_generation(2)
    book.on_report(Report(1, "a", 2, "serving"), True)
    left = book.on_report(Report(1, "new", None, "idle"), True)  # its supervisor restarted alone
    assert left is not None and left.failure_class is FailureClass.CHILD_CRASHED
    book.new_generation(3)
    assert book.on_report(Report(1, "new", None, "idle"), True) is None  # not yet joined: no failure


def kw(**over: object) -> dict[str, object]:
    base: dict[str, object] = dict(silent_s=0.0, leader_timeout_s=10.0, instance="me", node_rank=1,
                                   running_generation=None, engine_alive=False, engine_failed=False,
                                   restart="group")
    base.update(over)
    return base


def test_worker_follows_a_fresh_generation_only() -> None:
    fresh = View(2, "fast", "starting", "group", {})
    assert worker_decide(fresh, **kw()) == Follow(2, "fast")  # type: ignore[arg-type]
    taken = View(2, "fast", "serving", "group", {1: "old"})
    assert isinstance(worker_decide(taken, **kw()), Wait)  # type: ignore[arg-type]


def test_worker_stops_when_the_leader_moves_on_or_goes_silent() -> None:
    running = kw(running_generation=2, engine_alive=True)
    assert isinstance(worker_decide(View(3, "safe", "starting", "group", {}), **running),  # type: ignore[arg-type]
                      StopLocal)
    assert isinstance(worker_decide(View(2, "fast", "stopping", "group", {1: "me"}), **running),  # type: ignore[arg-type]
                      StopLocal)
    assert isinstance(worker_decide(None, **{**running, "silent_s": 11.0}), StopLocal)  # type: ignore[arg-type]
    assert isinstance(worker_decide(None, **{**running, "silent_s": 3.0}), Wait)  # type: ignore[arg-type]


def test_external_mode_exits_instead_of_restarting() -> None:
    ext = kw(running_generation=2, engine_alive=False, engine_failed=True, restart="external")
    assert isinstance(worker_decide(View(2, "fast", "serving", "external", {1: "me"}), **ext),  # type: ignore[arg-type]
                      ExitGroup)
    assert isinstance(worker_decide(None, **{**ext, "silent_s": 11.0}), ExitGroup)  # type: ignore[arg-type]
