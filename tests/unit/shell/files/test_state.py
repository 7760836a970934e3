"""Persisted state: pure transitions, the JSON round trip, and the file adapter's guarantees."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path

import pytest
import structlog

from sglang_supervisor.shell.files.state import (
    STATE_FILE,
    State,
    StateFormatError,
    StateStore,
    baseline_key,
    command_hash,
    fingerprint,
    from_json,
    to_json,
    with_bad,
    with_baseline,
    with_good,
    with_ranking,
)

DAY = 86400.0
FP = fingerprint("Qwen/Qwen3.6-27B", "0.5.23", ["NVIDIA H200", "NVIDIA H200"], "580.65", "abc")


def test_fingerprint_is_stable_and_sensitive_to_every_part() -> None:
    base = ("m", "0.5.23", ["H200", "H200"], "580", "cmd")
    assert fingerprint(*base) == fingerprint(*base)
    assert len(fingerprint(*base)) == 16
    variants = [
        ("m2", "0.5.23", ["H200", "H200"], "580", "cmd"),
        ("m", "0.5.22", ["H200", "H200"], "580", "cmd"),
        ("m", "0.5.23", ["H200"], "580", "cmd"),
        ("m", "0.5.23", ["H200", "H200"], "575", "cmd"),
        ("m", "0.5.23", ["H200", "H200"], "580", "cmd2"),
    ]
    assert len({fingerprint(*v) for v in variants} | {fingerprint(*base)}) == 6


def test_command_hash_covers_argv_and_env_but_not_env_order() -> None:
    a = command_hash(["python", "-m", "sglang.launch_server", "--tp", "2"], {"A": "1", "B": "2"})
    assert a == command_hash(["python", "-m", "sglang.launch_server", "--tp", "2"], {"B": "2", "A": "1"})
    assert a != command_hash(["python", "-m", "sglang.launch_server", "--tp", "1"], {"A": "1", "B": "2"})
    assert a != command_hash(["python", "-m", "sglang.launch_server", "--tp", "2"], {"A": "1"})


def test_baseline_key_names_the_probe_shape() -> None:
    assert baseline_key("fp", 256, 128) == "fp/in256-out128-c1"
    assert baseline_key("fp", 256, 128) != baseline_key("fp", 256, 64)


def test_good_clears_bad_and_bad_clears_good() -> None:
    s = with_bad(State(), "fp", "primary", "capture_oom", 10.0)
    s = with_bad(s, "fp", "primary", "capture_oom", 20.0)
    assert s.fingerprints["fp"].bad["primary"].count == 2
    assert s.fingerprints["fp"].bad["primary"].at == 20.0
    s = with_good(s, "fp", "primary", 30.0)
    assert "primary" not in s.fingerprints["fp"].bad
    assert s.fingerprints["fp"].last_good is not None
    s = with_bad(s, "fp", "primary", "hang", 40.0)
    assert s.fingerprints["fp"].last_good is None  # it just failed: do not start with it next time
    s = with_good(s, "fp", "eager", 50.0)
    s = with_bad(s, "fp", "primary", "hang", 60.0)
    assert s.fingerprints["fp"].last_good is not None
    assert s.fingerprints["fp"].last_good.profile == "eager"


def test_json_round_trip() -> None:
    s = with_good(State(), "fp", "eager", 1.0)
    s = with_bad(s, "fp", "primary", "prefill_graph_failed", 2.0)
    s = with_ranking(s, "fp", ["eager", "primary"], 3.0)
    s = with_baseline(s, "fp/in256-out128-c1", 1234.5, 4.0)
    assert from_json(json.loads(json.dumps(to_json(s)))) == s


@pytest.mark.parametrize(
    "data",
    [[], {"version": 99}, {"version": 1, "fingerprints": {"fp": {"bad": {"p": {"at": 1}}}}},
     {"version": 1, "baselines": {"k": {"value": "fast", "at": 1}}}],
)
def test_malformed_content_is_a_format_error(data: object) -> None:
    with pytest.raises(StateFormatError):
        from_json(data)


def test_store_persists_across_instances(tmp_path: Path) -> None:
    a = StateStore(tmp_path)
    assert a.mark_good(FP, "eager", 100.0)
    assert a.mark_bad(FP, "primary", "prefill_graph_failed", 100.0)
    assert a.set_baseline("k", 900.0, 100.0)
    assert a.set_ranking(FP, ["eager", "primary"], 100.0)
    b = StateStore(tmp_path)  # the supervisor restarted
    assert b.last_good(FP) == "eager"
    bad = b.known_bad(FP, now=100.0 + 60, ttl_s=DAY)
    assert list(bad) == ["primary"]
    assert bad["primary"].failure_class == "prefill_graph_failed"
    baseline = b.baseline("k")
    assert baseline is not None
    assert baseline.value == 900.0
    assert b.ranking(FP) == ["eager", "primary"]
    assert b.last_good("other") is None
    assert b.ranking("other") is None
    assert b.known_bad("other", 0.0, DAY) == {}


def test_file_mode_is_0640_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        StateStore(tmp_path).mark_good(FP, "eager", 1.0)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / STATE_FILE).stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_known_bad_expires_and_survives_clock_steps(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.mark_bad(FP, "primary", "hang", 1000.0)
    assert "primary" in store.known_bad(FP, 1000.0 + DAY - 1, ttl_s=DAY)
    assert store.known_bad(FP, 1000.0 + DAY + 1, ttl_s=DAY) == {}
    # The clock was stepped back a year: the record must not stay "bad" for a year plus the TTL.
    assert store.known_bad(FP, 1000.0 - 365 * DAY, ttl_s=DAY) == {}
    assert "primary" in store.known_bad(FP, 1000.0 - 60, ttl_s=DAY)  # a small step back: still bad
    assert store.known_bad(FP, 1000.0, ttl_s=0) == {}  # ttl 0: failures are not remembered


def test_clear_bad_is_the_retry_flag(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.mark_bad(FP, "primary", "hang", 1.0)
    store.mark_bad(FP, "no-prefill-graph", "capture_oom", 1.0)
    store.clear_bad(FP, "primary")
    assert list(store.known_bad(FP, 1.0, DAY)) == ["no-prefill-graph"]
    store.clear_bad(FP)
    assert StateStore(tmp_path).known_bad(FP, 1.0, DAY) == {}
    assert store.clear_bad("never-seen")


def test_corrupt_file_is_moved_aside_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text('{"version": 1, "fingerpr')
    with structlog.testing.capture_logs() as logs:
        store = StateStore(tmp_path)
    assert store.last_good(FP) is None
    [warning] = [e for e in logs if e["event"] == "state.corrupt"]
    assert warning["log_level"] == "warning"
    aside = list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))
    assert len(aside) == 1
    assert aside[0].read_text() == '{"version": 1, "fingerpr'
    assert store.mark_good(FP, "eager", 1.0)
    assert StateStore(tmp_path).last_good(FP) == "eager"


def test_a_full_disk_keeps_state_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path)
    store.mark_good(FP, "primary", 0.5)

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with structlog.testing.capture_logs() as logs:
        assert not store.mark_bad(FP, "primary", "hang", 1.0)
        assert not store.mark_good(FP, "eager", 1.0)
    assert [e["event"] for e in logs].count("state.write_failed") == 1  # once, not once per change
    assert store.last_good(FP) == "eager"
    assert "primary" in store.known_bad(FP, 1.0, DAY)
    assert StateStore(tmp_path).last_good(FP) == "primary"  # the file still holds the old, whole state
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    monkeypatch.undo()
    assert store.set_baseline("k", 1.0, 2.0)  # the disk recovered: everything known is written
    assert StateStore(tmp_path).last_good(FP) == "eager"


def test_a_second_store_sees_the_first_ones_writes(tmp_path: Path) -> None:
    a, b = StateStore(tmp_path), StateStore(tmp_path)
    a.mark_good(FP, "primary", 1.0)
    assert b.last_good(FP) == "primary"
    b.mark_good(FP, "eager", 2.0)  # last write wins
    assert a.last_good(FP) == "eager"


def test_concurrent_writers_lose_nothing_and_never_half_write(tmp_path: Path) -> None:
    stores = [StateStore(tmp_path), StateStore(tmp_path)]
    errors: list[str] = []
    stop = threading.Event()

    def writer(idx: int) -> None:
        for i in range(60):
            stores[idx].set_baseline(f"w{idx}-{i}", float(i), float(i))

    def reader() -> None:
        path = tmp_path / STATE_FILE
        while not stop.is_set():
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            try:
                from_json(json.loads(text))
            except (ValueError, StateFormatError) as exc:
                errors.append(f"{exc}: {text[:80]!r}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert errors == []
    final = StateStore(tmp_path).snapshot()
    assert set(final.baselines) == {f"w{w}-{i}" for w in range(2) for i in range(60)}


# -- hostile content: any bytes in the file are moved aside, never an exception ------------------

_GOOD_RECORD = {"failure_class": "hang", "at": 1.0, "count": 1}


def _doc(**fp_fields: object) -> bytes:
    return json.dumps({"version": 1, "fingerprints": {FP: fp_fields}}).encode()


HOSTILE: dict[str, bytes] = {
    "invalid JSON": b'{"version": 1, "fingerprints": {',
    "invalid UTF-8": b'{"version": 1, "x": "\xff\xfe"}',
    "deep nesting": b"[" * 200_000 + b"]" * 200_000,
    "deep nesting inside a record": b'{"version": 1, "fingerprints": {"a": ' + b"[" * 100_000,
    "infinite timestamp": _doc(bad={"p": {**_GOOD_RECORD, "at": 1e400}}),
    "NaN timestamp": b'{"version": 1, "fingerprints": {"a": {"touched": NaN}}}',
    "negative timestamp": _doc(last_good={"profile": "p", "at": -5}),
    "timestamp in year 10000+": _doc(touched=1e12),
    "count out of range": _doc(bad={"p": {**_GOOD_RECORD, "count": 10**30}}),
    "count of zero": _doc(bad={"p": {**_GOOD_RECORD, "count": 0}}),
    "boolean count": _doc(bad={"p": {**_GOOD_RECORD, "count": True}}),
    "boolean version": b'{"version": true}',
    "string timestamp": _doc(last_good={"profile": "p", "at": "yesterday"}),
    "list where an object belongs": _doc(bad=["p"]),
    "number as a profile name": _doc(last_good={"profile": 7, "at": 1.0}),
    "control character in a name": _doc(last_good={"profile": "p\nq", "at": 1.0}),
    "empty name": _doc(bad={"": _GOOD_RECORD}),
    "huge name": _doc(last_good={"profile": "p" * 100_000, "at": 1.0}),
    "a number with 5000 digits": b'{"version": 1, "internal_errors": ' + b"9" * 5000 + b"}",
    "baseline of infinity":
        json.dumps({"version": 1, "baselines": {"k": {"value": 1e999, "at": 1}}}).encode(),
    "top level is a string": b'"state"',
    "empty file": b"",
    "bigger than the cap": b'{"version": 1, "pad": "' + b"x" * (5 << 20) + b'"}',
}


@pytest.mark.parametrize("content", list(HOSTILE.values()), ids=list(HOSTILE))
def test_any_hostile_content_is_moved_aside_naming_where(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "m.state.json").write_bytes(content)
    with structlog.testing.capture_logs() as logs:
        store = StateStore(tmp_path, "m")
        assert store.snapshot() == State()
    [warning] = [e for e in logs if e["event"] == "state.corrupt"]
    assert warning["reason"] and len(warning["reason"]) <= 300
    moved = Path(warning["moved_to"])
    assert moved.parent == tmp_path and moved.name.startswith("m.state.json.corrupt-")
    assert moved.read_bytes() == content  # kept for inspection, byte for byte
    assert not (tmp_path / "m.state.json").exists()
    assert store.mark_good(FP, "eager", 1.0)  # and the store works on
    assert StateStore(tmp_path, "m").last_good(FP) == "eager"


def test_content_corrupted_while_running_is_moved_aside_at_the_next_read(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "m")
    store.mark_good(FP, "eager", 1.0)
    (tmp_path / "m.state.json").write_bytes(HOSTILE["infinite timestamp"])
    with structlog.testing.capture_logs() as logs:
        assert store.last_good(FP) is None  # what a reload reads
    assert [e["event"] for e in logs] == ["state.corrupt"]


def test_a_file_that_cannot_be_moved_aside_is_reported_once(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m.state.json").write_bytes(b"{")

    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", refuse)
    with structlog.testing.capture_logs() as logs:
        store = StateStore(tmp_path, "m")
        for _ in range(3):
            assert store.snapshot() == State()
    [warning] = [e for e in logs if e["event"] == "state.corrupt"]
    assert warning["moved_to"] is None


def test_only_the_newest_corrupt_files_are_kept(tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"m.state.json.corrupt-2026010{i}T000000-1").write_text("x")
        os.utime(tmp_path / f"m.state.json.corrupt-2026010{i}T000000-1", (i, i))
    (tmp_path / "m.state.json").write_bytes(b"{")
    StateStore(tmp_path, "m")
    kept = {p.name for p in tmp_path.glob("m.state.json.corrupt-*")}
    old = {"m.state.json.corrupt-20260105T000000-1", "m.state.json.corrupt-20260104T000000-1"}
    assert len(kept) == 3 and old < kept  # the one just moved aside and the two newest before it


def test_each_model_has_its_own_file(tmp_path: Path) -> None:
    StateStore(tmp_path, "qwen").mark_bad(FP, "tuned", "capture_oom", 1.0)
    assert StateStore(tmp_path, "llama").known_bad(FP, 1.0, DAY) == {}
    assert list(StateStore(tmp_path, "qwen").known_bad(FP, 1.0, DAY)) == ["tuned"]
    assert sorted(p.name for p in tmp_path.glob("*.state.json")) == ["qwen.state.json"]


def test_the_shared_file_of_older_releases_seeds_each_models_file_once(tmp_path: Path) -> None:
    legacy = StateStore(tmp_path)
    legacy.mark_good(FP, "eager", 1.0)
    legacy.mark_bad(FP, "tuned", "hang", 1.0)
    with structlog.testing.capture_logs() as logs:
        qwen = StateStore(tmp_path, "qwen")
    assert qwen.last_good(FP) == "eager" and list(qwen.known_bad(FP, 1.0, DAY)) == ["tuned"]
    assert [e["event"] for e in logs] == ["state.seeded"]
    qwen.forget("tuned")
    assert StateStore(tmp_path, "qwen").known_bad(FP, 1.0, DAY) == {}  # not seeded again
    assert list(StateStore(tmp_path).known_bad(FP, 1.0, DAY)) == ["tuned"]  # the shared file is left


def test_a_corrupt_shared_file_seeds_nothing_and_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_bytes(b"{")
    with structlog.testing.capture_logs() as logs:
        assert StateStore(tmp_path, "qwen").snapshot() == State()
    assert [e["event"] for e in logs] == ["state.seed_skipped"]
    assert (tmp_path / STATE_FILE).read_bytes() == b"{"


def test_forget_one_profile_or_the_whole_memory(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "qwen")
    store.mark_good(FP, "eager", 1.0)
    store.mark_bad(FP, "tuned", "hang", 2.0)
    store.mark_bad(FP, "no-spec", "capture_oom", 2.0)
    store.mark_bad("other-fp", "tuned", "hang", 2.0)
    store.set_baseline("k", 10.0, 2.0)
    assert store.forget("tuned") == 2
    assert list(store.known_bad(FP, 2.0, DAY)) == ["no-spec"] and store.last_good(FP) == "eager"
    assert store.forget("tuned") == 0
    assert store.forget() == 2  # no-spec's record and eager's last-good
    assert store.known_bad(FP, 2.0, DAY) == {} and store.last_good(FP) is None
    assert store.baseline("k") is not None  # speed measurements are not failures


def test_below_best_since_survives_restarts_and_clears_at_the_best(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "qwen")
    store.mark_serving(FP, "eager", 100.0, below_best=True)
    store.mark_serving(FP, "eager", 500.0, below_best=True)
    assert StateStore(tmp_path, "qwen").fingerprint_state(FP).below_best_since == 100.0
    store.mark_serving(FP, "tuned", 900.0, below_best=False)
    assert store.fingerprint_state(FP).below_best_since is None
    s = with_good(State(), "fp", "eager", 5.0)  # tune's mark: leaves it as it was
    assert s.fingerprints["fp"].below_best_since is None


def test_internal_errors_are_counted_across_instances(tmp_path: Path) -> None:
    StateStore(tmp_path, "qwen").count_internal_error()
    StateStore(tmp_path, "qwen").count_internal_error()
    assert StateStore(tmp_path, "qwen").snapshot().internal_errors == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another owner")
def test_root_writes_keep_the_service_users_ownership(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "qwen")
    store.mark_good(FP, "eager", 1.0)
    os.chown(tmp_path, 4242, 4343)
    os.chown(tmp_path / "qwen.state.json", 4242, 4343)
    StateStore(tmp_path, "qwen").forget()  # `sudo sglang-supervisor forget`
    for name in ("qwen.state.json", "qwen.state.json.lock"):
        st = (tmp_path / name).stat()
        assert (st.st_uid, st.st_gid) == (4242, 4343), name


def test_a_derived_profile_that_served_is_remembered_and_forgotten_with_its_base(tmp_path: Path) -> None:
    """Issue 25: the derived profile that reached READY survives a restart (the file), with the
    change that made it; `forget` (all, or its base, or itself) clears it."""
    from sglang_supervisor.core.derive import Derivation
    from sglang_supervisor.shell.files.state import StateStore

    d = Derivation("tuned-no-sbo", "tuned", ("enable-single-batch-overlap",), {"cuda-graph-max-bs": 16},
                   2, "drop --enable-single-batch-overlap", "ValueError: SBO ... Please try removing")
    for forget_what in (None, "tuned", "tuned-no-sbo"):
        store = StateStore(tmp_path / str(forget_what), "qwen")
        store.mark_serving("fp", "tuned-no-sbo", 10.0, below_best=True, derived=d)
        fs = StateStore(tmp_path / str(forget_what), "qwen").fingerprint_state("fp")
        assert fs.derived == {"tuned-no-sbo": d} and fs.last_good is not None
        assert store.forget(forget_what) >= 1
        fs = StateStore(tmp_path / str(forget_what), "qwen").fingerprint_state("fp")
        assert fs.derived == {} and fs.last_good is None
    other = StateStore(tmp_path / "other", "qwen")
    other.mark_serving("fp", "tuned-no-sbo", 10.0, below_best=True, derived=d)
    other.forget("low-mem")  # another profile: the derived one stays
    assert StateStore(tmp_path / "other", "qwen").fingerprint_state("fp").derived == {"tuned-no-sbo": d}
