"""Persisted state: what worked and what failed, per deployment fingerprint, in `state.json`.

A fingerprint names one combination of model, engine version, GPUs, driver and rendered command:
a profile that failed on one driver may well work on the next, so nothing carries across.

The data model and its JSON (de)serialisation are pure; `StateStore` is the thin file adapter:
atomic replace (tmp + fsync + rename), mode 0640, an advisory lock so two writers never lose each
other's updates, a corrupt file moved aside with a warning. Persisting is best effort: a full or
read-only disk is logged, the in-memory state stays authoritative and the daemon keeps running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("sglang_supervisor.state")

STATE_FILE = "state.json"
SCHEMA_VERSION = 1
MAX_FINGERPRINTS = 64  # oldest-touched are forgotten beyond this: the file must not grow forever
MAX_BASELINES = 256


def fingerprint(
    model: str, engine_version: str, gpu_names: Sequence[str], driver: str, command_hash: str
) -> str:
    """A stable short id of one deployment (order of GPUs matters: TP ranks map to them)."""
    canonical = json.dumps(
        {"model": model, "engine": engine_version, "gpus": list(gpu_names), "driver": driver,
         "command": command_hash},
        sort_keys=True, separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def command_hash(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Hash of a rendered command (argv + env), for `fingerprint`. Secrets never reach argv."""
    payload = json.dumps({"argv": list(argv), "env": dict(sorted((env or {}).items()))}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def baseline_key(fp: str, input_tokens: int, max_new_tokens: int, concurrency: int = 1) -> str:
    """A probe baseline is only comparable with probes of the same shape on the same deployment."""
    return f"{fp}/in{input_tokens}-out{max_new_tokens}-c{concurrency}"


# -- pure data ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class GoodRecord:
    profile: str
    at: float  # wall-clock seconds (time.time())


@dataclass(frozen=True, slots=True)
class BadRecord:
    failure_class: str
    at: float  # last failure
    count: int = 1


@dataclass(frozen=True, slots=True)
class Baseline:
    value: float  # tok/s
    at: float


@dataclass(frozen=True, slots=True)
class Ranking:
    profiles: tuple[str, ...]
    at: float


@dataclass(frozen=True, slots=True)
class FingerprintState:
    last_good: GoodRecord | None = None
    bad: Mapping[str, BadRecord] = field(default_factory=dict)
    ranking: Ranking | None = None
    touched: float = 0.0


@dataclass(frozen=True, slots=True)
class State:
    fingerprints: Mapping[str, FingerprintState] = field(default_factory=dict)
    baselines: Mapping[str, Baseline] = field(default_factory=dict)


def is_fresh(record: BadRecord, now: float, ttl_s: float) -> bool:
    # abs(): after the clock was stepped back, a record "from the future" must still expire.
    return ttl_s > 0 and abs(now - record.at) < ttl_s


def with_good(state: State, fp: str, profile: str, now: float) -> State:
    cur = state.fingerprints.get(fp, FingerprintState())
    bad = {k: v for k, v in cur.bad.items() if k != profile}  # it works now: no longer bad
    return _put(state, fp, dataclasses.replace(cur, last_good=GoodRecord(profile, now), bad=bad, touched=now))


def with_bad(state: State, fp: str, profile: str, failure_class: str, now: float) -> State:
    cur = state.fingerprints.get(fp, FingerprintState())
    prev = cur.bad.get(profile)
    record = BadRecord(failure_class, now, 1 if prev is None else prev.count + 1)
    last_good = cur.last_good
    if last_good is not None and last_good.profile == profile:
        last_good = None  # the last good profile just failed: do not start with it next time
    bad = {**cur.bad, profile: record}
    return _put(state, fp, dataclasses.replace(cur, bad=bad, last_good=last_good, touched=now))


def without_bad(state: State, fp: str, profile: str | None = None) -> State:
    cur = state.fingerprints.get(fp)
    if cur is None:
        return state
    bad = {} if profile is None else {k: v for k, v in cur.bad.items() if k != profile}
    return _put(state, fp, dataclasses.replace(cur, bad=bad))


def with_ranking(state: State, fp: str, ranking: Sequence[str], now: float) -> State:
    cur = state.fingerprints.get(fp, FingerprintState())
    return _put(state, fp, dataclasses.replace(cur, ranking=Ranking(tuple(ranking), now), touched=now))


def with_baseline(state: State, key: str, value: float, now: float) -> State:
    baselines = {**state.baselines, key: Baseline(float(value), now)}
    if len(baselines) > MAX_BASELINES:
        keep = sorted(baselines, key=lambda k: baselines[k].at, reverse=True)[:MAX_BASELINES]
        baselines = {k: baselines[k] for k in keep}
    return dataclasses.replace(state, baselines=baselines)


def _put(state: State, fp: str, fs: FingerprintState) -> State:
    fps = {**state.fingerprints, fp: fs}
    if len(fps) > MAX_FINGERPRINTS:
        keep = sorted(fps, key=lambda k: fps[k].touched, reverse=True)[:MAX_FINGERPRINTS]
        fps = {k: fps[k] for k in keep}
    return dataclasses.replace(state, fingerprints=fps)


def to_json(state: State) -> dict[str, Any]:
    return {
        "version": SCHEMA_VERSION,
        "fingerprints": {
            fp: {
                "last_good": None if fs.last_good is None else dataclasses.asdict(fs.last_good),
                "bad": {p: dataclasses.asdict(r) for p, r in fs.bad.items()},
                "ranking": None if fs.ranking is None
                else {"profiles": list(fs.ranking.profiles), "at": fs.ranking.at},
                "touched": fs.touched,
            }
            for fp, fs in state.fingerprints.items()
        },
        "baselines": {k: dataclasses.asdict(b) for k, b in state.baselines.items()},
    }


class StateFormatError(ValueError):
    pass


def from_json(data: object) -> State:
    """Parse state.json's content. Unknown keys are ignored (a newer supervisor may add some)."""
    try:
        if not isinstance(data, dict):
            raise StateFormatError("top level is not an object")
        version = data.get("version")
        if version != SCHEMA_VERSION:
            raise StateFormatError(f"schema version {version!r}, expected {SCHEMA_VERSION}")
        fps: dict[str, FingerprintState] = {}
        for fp, raw in dict(data.get("fingerprints") or {}).items():
            lg = raw.get("last_good")
            rk = raw.get("ranking")
            fps[str(fp)] = FingerprintState(
                last_good=None if lg is None else GoodRecord(str(lg["profile"]), float(lg["at"])),
                bad={
                    str(p): BadRecord(str(r["failure_class"]), float(r["at"]), int(r.get("count", 1)))
                    for p, r in dict(raw.get("bad") or {}).items()
                },
                ranking=None if rk is None
                else Ranking(tuple(str(p) for p in rk["profiles"]), float(rk["at"])),
                touched=float(raw.get("touched", 0.0)),
            )
        baselines = {
            str(k): Baseline(float(b["value"]), float(b["at"]))
            for k, b in dict(data.get("baselines") or {}).items()
        }
    except StateFormatError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise StateFormatError(f"unexpected shape: {type(exc).__name__}: {exc}") from exc
    return State(fps, baselines)


# -- file adapter ---------------------------------------------------------------------------------

class StateStore:
    """state.json in `directory`. Every change is re-read, applied and written under a lock."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STATE_FILE
        self._lock_path = self.directory / (STATE_FILE + ".lock")
        self._state = State()
        self._signature: tuple[int, int, int] | None = None
        self._dirty = False  # the last write failed: memory is newer than the file
        self._write_error: str | None = None
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._refresh()

    # -- queries --------------------------------------------------------------------------------
    def snapshot(self) -> State:
        self._refresh()
        return self._state

    def last_good(self, fp: str) -> str | None:
        fs = self.snapshot().fingerprints.get(fp)
        return None if fs is None or fs.last_good is None else fs.last_good.profile

    def known_bad(self, fp: str, now: float, ttl_s: float) -> dict[str, BadRecord]:
        fs = self.snapshot().fingerprints.get(fp)
        if fs is None:
            return {}
        return {p: r for p, r in fs.bad.items() if is_fresh(r, now, ttl_s)}

    def baseline(self, key: str) -> Baseline | None:
        return self.snapshot().baselines.get(key)

    def ranking(self, fp: str) -> list[str] | None:
        fs = self.snapshot().fingerprints.get(fp)
        return None if fs is None or fs.ranking is None else list(fs.ranking.profiles)

    # -- changes (return whether the change reached the disk) ----------------------------------
    def mark_good(self, fp: str, profile: str, now: float) -> bool:
        return self._update(lambda s: with_good(s, fp, profile, now))

    def mark_bad(self, fp: str, profile: str, failure_class: str, now: float) -> bool:
        return self._update(lambda s: with_bad(s, fp, profile, str(failure_class), now))

    def clear_bad(self, fp: str, profile: str | None = None) -> bool:
        return self._update(lambda s: without_bad(s, fp, profile))

    def set_baseline(self, key: str, value: float, now: float) -> bool:
        return self._update(lambda s: with_baseline(s, key, value, now))

    def set_ranking(self, fp: str, ranking: Sequence[str], now: float) -> bool:
        return self._update(lambda s: with_ranking(s, fp, ranking, now))

    # -- file mechanics -------------------------------------------------------------------------
    def _update(self, change: Any) -> bool:
        with self._locked():
            self._refresh()
            self._state = change(self._state)
            return self._write()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError:
            yield  # cannot even create the lock file: the write will fail and be reported
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _stat_signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        if self._dirty:
            return  # keep what we know; the file lags behind after a failed write
        sig = self._stat_signature()
        if sig == self._signature:
            return
        if sig is None:
            self._state, self._signature = State(), None
            return
        try:
            text = self.path.read_text(encoding="utf-8")
            self._state = from_json(json.loads(text))
            self._signature = sig
        except FileNotFoundError:
            self._state, self._signature = State(), None
        except (StateFormatError, ValueError, UnicodeDecodeError) as exc:
            self._quarantine(str(exc))
        except OSError as exc:
            log.warning("state.unreadable", path=str(self.path), error=str(exc),
                        hint="starting without remembered good/bad profiles; check permissions")

    def _quarantine(self, reason: str) -> None:
        aside = self.path.with_name(f"{STATE_FILE}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
            moved: str | None = str(aside)
        except OSError:
            moved = None
        log.warning("state.corrupt", path=str(self.path), moved_to=moved, reason=reason,
                    hint="starting without remembered good/bad profiles; the old file is kept for inspection")
        self._state, self._signature = State(), None

    def _write(self) -> bool:
        payload = json.dumps(to_json(self._state), indent=1, sort_keys=True).encode() + b"\n"
        tmp = self.path.with_name(f".{STATE_FILE}.{os.getpid()}.{id(self):x}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
            try:
                os.fchmod(fd, 0o640)  # whatever the umask says
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)  # the rename itself survives a power cut
            finally:
                os.close(dfd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._dirty = True
            message = f"{type(exc).__name__}: {exc}"
            if message != self._write_error:  # once per distinct error, not once per change
                self._write_error = message
                log.warning("state.write_failed", path=str(self.path), error=message,
                            hint="remembered profiles live in memory only until the disk recovers")
            return False
        self._dirty = False
        if self._write_error is not None:
            log.info("state.write_recovered", path=str(self.path))
            self._write_error = None
        self._signature = self._stat_signature()
        return True
