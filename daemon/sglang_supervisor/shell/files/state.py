"""Persisted state: what worked and what failed, per deployment fingerprint, one file per model
(`<name>.state.json` in `state_dir`: two units never share one memory).

A fingerprint names one combination of model, engine version, GPUs, driver and rendered command:
a profile that failed on one driver may well work on the next, so nothing carries across.

The data model and its JSON (de)serialisation are pure; `StateStore` is the thin file adapter:
atomic replace (tmp + fsync + rename), mode 0640, an advisory lock so two writers never lose each
other's updates, a corrupt file moved aside with a warning. Persisting is best effort: a full or
read-only disk is logged, the in-memory state stays authoritative and the daemon keeps running.

The file is untrusted input (an operator's editor, a disk error, another program): it is read
with a size cap, parsed with explicit type and range checks (finite numbers, bounded counts and
names), and anything else, whatever the content, is moved aside with a warning naming where it
went. The daemon then starts without remembered profiles instead of crashing or crash-looping.

Long because: the persisted state's data model, its JSON schema and every recovery from a bad file
(moved aside, never a crash) belong with the store that reads and writes it atomically under a lock:
one file format and its only reader and writer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from sglang_supervisor.core.config import Config
from sglang_supervisor.core.derive import Derivation

log = structlog.get_logger("sglang_supervisor.shell.files.state")

STATE_FILE = "state.json"  # before per-model files: read once to seed a model's own file
SCHEMA_VERSION = 1
MAX_FINGERPRINTS = 64  # oldest-touched are forgotten beyond this: the file must not grow forever
MAX_BASELINES = 256
MAX_BAD_PER_FINGERPRINT = 256
# A legitimate file is a few hundred KiB at most (the caps above); anything bigger is not ours.
MAX_FILE_BYTES = 4 << 20
MAX_NAME_CHARS = 256  # profile names, fingerprints, baseline keys, failure classes
MAX_TIMESTAMP = 1e11  # year 5138: a bigger "when" is corruption, not a date
MAX_COUNT = 1_000_000
MAX_BASELINE = 1e9  # tokens/s
MAX_DERIVED_PER_FINGERPRINT = 16  # derived profiles that served (core/derive.py bounds their steps)
MAX_DERIVED_ARGS = 16
KEEP_CORRUPT = 3  # moved-aside files kept for inspection; older ones are deleted


def state_file_name(name: str | None) -> str:
    """The file of one model (`Config.name`); None: the shared file of older releases."""
    return STATE_FILE if name is None else f"{name}.state.json"


def releases_path(config: Config) -> Path:
    """The upgrade canary's release memory of one model (shell/upgrades.py)."""
    return Path(config.state_dir) / f"{config.name}.releases.json"


def request_path(config: Config) -> Path:
    """Where `upgrade --now` leaves its request for the daemon's next reload."""
    return Path(config.state_dir) / f"{config.name}.upgrade.json"


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
    # Since when this deployment serves a profile below the best of its ladder (None: at the best).
    below_best_since: float | None = None
    # Derived profiles (core/derive.py) that reached READY here, by name: the next start can go
    # straight to one instead of failing its base first.
    derived: Mapping[str, Derivation] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class State:
    fingerprints: Mapping[str, FingerprintState] = field(default_factory=dict)
    baselines: Mapping[str, Baseline] = field(default_factory=dict)
    # Exceptions inside the supervisor (its own bugs), kept across restarts for the metric.
    internal_errors: int = 0


def is_fresh(record: BadRecord, now: float, ttl_s: float) -> bool:
    # abs(): after the clock was stepped back, a record "from the future" must still expire.
    return ttl_s > 0 and abs(now - record.at) < ttl_s


def with_good(state: State, fp: str, profile: str, now: float, below_best: bool | None = None,
              *, derived: Derivation | None = None) -> State:
    """`profile` served. `below_best`: it is not the first of the ladder (None: leave as is).
    `derived`: `profile` is this derived profile, remembered with it."""
    cur = state.fingerprints.get(fp, FingerprintState())
    if derived is not None:
        kept = {k: v for k, v in cur.derived.items() if k != derived.name}
        kept = dict(list(kept.items())[-(MAX_DERIVED_PER_FINGERPRINT - 1):])
        cur = dataclasses.replace(cur, derived={**kept, derived.name: derived})
    bad = {k: v for k, v in cur.bad.items() if k != profile}  # it works now: no longer bad
    since = cur.below_best_since
    if below_best is not None:
        since = (since if since is not None else now) if below_best else None
    return _put(state, fp, dataclasses.replace(cur, last_good=GoodRecord(profile, now), bad=bad,
                                               touched=now, below_best_since=since))


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


def without_memory(state: State, profile: str | None = None) -> tuple[State, int]:
    """`forget`: drop `profile`'s known-bad records in every fingerprint (None: every record and
    every last-good, so the next start climbs the ladder from the top). Returns (state, records
    dropped). Baselines stay: they measure speed, not failures."""
    fps: dict[str, FingerprintState] = {}
    dropped = 0
    for fp, cur in state.fingerprints.items():
        if profile is None:
            dropped += len(cur.bad) + (cur.last_good is not None) + len(cur.derived)
            fps[fp] = dataclasses.replace(cur, bad={}, last_good=None, ranking=None, derived={})
        else:
            # P's derived profiles go with P: they are P with one change.
            gone = {n for n, d in cur.derived.items() if profile in (n, d.base)}
            dropped += (profile in cur.bad) + len(gone)
            last_good = cur.last_good if cur.last_good is None or cur.last_good.profile not in gone \
                else None
            fps[fp] = dataclasses.replace(
                cur, bad={k: v for k, v in cur.bad.items() if k != profile}, last_good=last_good,
                derived={n: d for n, d in cur.derived.items() if n not in gone})
    return dataclasses.replace(state, fingerprints=fps), dropped


def with_internal_error(state: State) -> State:
    return dataclasses.replace(state, internal_errors=min(state.internal_errors + 1, MAX_COUNT))


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
                "below_best_since": fs.below_best_since,
                "derived": {n: d.to_json() for n, d in fs.derived.items()},
            }
            for fp, fs in state.fingerprints.items()
        },
        "baselines": {k: dataclasses.asdict(b) for k, b in state.baselines.items()},
        "internal_errors": state.internal_errors,
    }


class StateFormatError(ValueError):
    pass


def _obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StateFormatError(f"{what} is a {type(value).__name__}, not an object")
    return value


def _opt_obj(value: object, what: str) -> dict[str, Any]:
    return {} if value is None else _obj(value, what)


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise StateFormatError(f"{what} is not a name of 1-{MAX_NAME_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise StateFormatError(f"{what} holds control characters")
    return value


def _number(value: object, what: str, high: float) -> float:
    # bool is an int to Python: a `true` timestamp is corruption, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StateFormatError(f"{what} is not a number")
    number = float(value)
    if not math.isfinite(number) or not 0 <= number <= high:
        raise StateFormatError(f"{what} = {number!r} is outside 0..{high:g}")
    return number


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise StateFormatError(f"{what} is not a whole number in 1..{MAX_COUNT}")
    return value


def _derived(fp: str, raw: object) -> dict[str, Derivation]:
    out: dict[str, Derivation] = {}
    for n, value in _opt_obj(raw, f"{fp}.derived").items():
        where = f"{fp}.derived.{_name(n, f'{fp}.derived key')}"
        r = _obj(value, where)
        remove, args = r.get("remove", []), _opt_obj(r.get("args"), f"{where}.args")
        if not isinstance(remove, list) or len(remove) > MAX_DERIVED_ARGS or len(args) > MAX_DERIVED_ARGS:
            raise StateFormatError(f"{where}: remove/args are not short")
        for k, v in args.items():
            _name(k, f"{where}.args key")
            if not isinstance(v, str | int | float | bool) or (isinstance(v, float)
                                                               and not math.isfinite(v)):
                raise StateFormatError(f"{where}.args.{k} is not a plain value")
        steps = _count(r.get("steps", 1), f"{where}.steps")
        text = {k: r.get(k, "") for k in ("change", "asked_by")}
        if not all(isinstance(t, str) and len(t) <= 1000 for t in text.values()):
            raise StateFormatError(f"{where}: change/asked_by are not short texts")
        out[n] = Derivation(n, _name(r.get("base"), f"{where}.base"),
                            tuple(_name(x, f"{where}.remove entry") for x in remove), dict(args),
                            steps, str(text["change"]), str(text["asked_by"]))
    if len(out) > MAX_DERIVED_PER_FINGERPRINT:
        out = dict(list(out.items())[-MAX_DERIVED_PER_FINGERPRINT:])
    return out


def _fingerprint_state(fp: str, raw: object) -> FingerprintState:
    raw = _obj(raw, f"fingerprint {fp}")
    lg, rk, since = raw.get("last_good"), raw.get("ranking"), raw.get("below_best_since")
    last_good = None
    if lg is not None:
        lg = _obj(lg, f"{fp}.last_good")
        last_good = GoodRecord(_name(lg.get("profile"), f"{fp}.last_good.profile"),
                               _number(lg.get("at"), f"{fp}.last_good.at", MAX_TIMESTAMP))
    bad: dict[str, BadRecord] = {}
    for p, value in _opt_obj(raw.get("bad"), f"{fp}.bad").items():
        where = f"{fp}.bad.{_name(p, f'{fp}.bad key')}"
        r = _obj(value, where)
        bad[p] = BadRecord(_name(r.get("failure_class"), f"{where}.failure_class"),
                           _number(r.get("at"), f"{where}.at", MAX_TIMESTAMP),
                           _count(r.get("count", 1), f"{where}.count"))
    if len(bad) > MAX_BAD_PER_FINGERPRINT:
        keep = sorted(bad, key=lambda k: bad[k].at, reverse=True)[:MAX_BAD_PER_FINGERPRINT]
        bad = {k: bad[k] for k in keep}
    ranking = None
    if rk is not None:
        rk = _obj(rk, f"{fp}.ranking")
        profiles = rk.get("profiles")
        if not isinstance(profiles, list) or len(profiles) > MAX_BAD_PER_FINGERPRINT:
            raise StateFormatError(f"{fp}.ranking.profiles is not a short list")
        ranking = Ranking(tuple(_name(p, f"{fp}.ranking entry") for p in profiles),
                          _number(rk.get("at"), f"{fp}.ranking.at", MAX_TIMESTAMP))
    return FingerprintState(
        last_good=last_good, bad=bad, ranking=ranking,
        touched=_number(raw.get("touched", 0.0), f"{fp}.touched", MAX_TIMESTAMP),
        below_best_since=None if since is None
        else _number(since, f"{fp}.below_best_since", MAX_TIMESTAMP),
        derived=_derived(fp, raw.get("derived")),
    )


def from_json(data: object) -> State:
    """Parse state.json's content, checking every type and range: StateFormatError (only) says
    what is wrong. Unknown keys are ignored (a newer supervisor may add some); entries beyond the
    caps are dropped, oldest first, as the writer would."""
    top = _obj(data, "the top level")
    version = top.get("version")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise StateFormatError(f"schema version {str(version)[:20]!r}, expected {SCHEMA_VERSION}")
    fps = {_name(fp, "a fingerprint"): _fingerprint_state(fp, raw)
           for fp, raw in _opt_obj(top.get("fingerprints"), "fingerprints").items()}
    if len(fps) > MAX_FINGERPRINTS:
        keep = sorted(fps, key=lambda k: fps[k].touched, reverse=True)[:MAX_FINGERPRINTS]
        fps = {k: fps[k] for k in keep}
    baselines: dict[str, Baseline] = {}
    for k, value in _opt_obj(top.get("baselines"), "baselines").items():
        where = f"baselines.{_name(k, 'a baseline key')}"
        b = _obj(value, where)
        baselines[k] = Baseline(_number(b.get("value"), f"{where}.value", MAX_BASELINE),
                                _number(b.get("at"), f"{where}.at", MAX_TIMESTAMP))
    if len(baselines) > MAX_BASELINES:
        keep = sorted(baselines, key=lambda k: baselines[k].at, reverse=True)[:MAX_BASELINES]
        baselines = {k: baselines[k] for k in keep}
    errors = top.get("internal_errors", 0)
    internal = 0 if errors == 0 else _count(errors, "internal_errors")
    return State(fps, baselines, internal)


def parse_text(raw: bytes) -> State:
    """The file's bytes -> State, or StateFormatError naming the problem, whatever the bytes are
    (invalid UTF-8 or JSON, nesting deep enough to exhaust the parser's recursion, huge numbers)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StateFormatError(f"not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise StateFormatError("JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int() of a number with too many digits
        raise StateFormatError(f"not JSON: {str(exc)[:200]}") from None
    return from_json(data)


def remembered_derived(directory: str | os.PathLike[str], name: str | None,
                       bases: Sequence[str]) -> dict[str, Derivation]:
    """The derived profiles (core/derive.py) this model's state file remembers as having served,
    on any fingerprint, whose written base is still one of `bases`; read-only (nothing created,
    nothing locked), {} when the file is absent, unreadable or not ours to parse (render, doctor)."""
    path = Path(directory) / state_file_name(name)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            return {}
        parsed = parse_text(raw)
    except (OSError, StateFormatError):
        return {}
    out: dict[str, Derivation] = {}
    for fs in parsed.fingerprints.values():
        for n, d in fs.derived.items():
            if d.base in bases:
                out.setdefault(n, d)
    return out


# -- file adapter ---------------------------------------------------------------------------------

class StateStore:
    """One model's state file in `directory` (`name`: `Config.name`; None: the shared state.json
    of older releases). Every change is re-read, applied and written under a lock."""

    def __init__(self, directory: str | os.PathLike[str], name: str | None = None) -> None:
        self.directory = Path(directory)
        self.file_name = state_file_name(name)
        self.path = self.directory / self.file_name
        self._lock_path = self.directory / (self.file_name + ".lock")
        self._state = State()
        self._signature: tuple[int, int, int] | None = None
        # A file that could not be parsed nor moved aside: not re-read (and re-reported) until it
        # changes.
        self._bad_signature: tuple[int, int, int] | None = None
        self._dirty = False  # the last write failed: memory is newer than the file
        self._write_error: str | None = None
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        if name is not None:
            self._seed_from_shared()
        self._refresh()

    def _seed_from_shared(self) -> None:
        """First start after the upgrade to per-model files: the shared state.json of older
        releases seeds this model's file (its fingerprints include the model, so another model's
        entries never match; the shared file is left for the other units)."""
        legacy = self.directory / STATE_FILE
        if self.path.exists() or not legacy.is_file():
            return
        try:
            with legacy.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
            seeded = parse_text(raw) if len(raw) <= MAX_FILE_BYTES else None
        except (OSError, StateFormatError) as exc:
            log.warning("state.seed_skipped", path=str(legacy), reason=str(exc)[:200])
            return
        if seeded is None or (not seeded.fingerprints and not seeded.baselines):
            return
        with self._locked():
            if self.path.exists():
                return
            self._state = dataclasses.replace(seeded, internal_errors=0)
            if self._write():
                log.info("state.seeded", path=str(self.path), source=str(legacy))

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

    def fingerprint_state(self, fp: str) -> FingerprintState:
        return self.snapshot().fingerprints.get(fp, FingerprintState())

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

    def mark_serving(self, fp: str, profile: str, now: float, below_best: bool,
                     derived: Derivation | None = None) -> bool:
        """`mark_good` for the running supervisor, which also tracks serving below the best (and
        remembers a derived profile that served)."""
        return self._update(lambda s: with_good(s, fp, profile, now, below_best, derived=derived))

    def count_internal_error(self) -> bool:
        return self._update(with_internal_error)

    def forget(self, profile: str | None = None) -> int:
        """Drop remembered failures (see `without_memory`); the number of records dropped.
        OSError when the file cannot be written (the caller reports it)."""
        with self._locked():
            self._refresh()
            forgotten, dropped = without_memory(self._state, profile)
            if dropped == 0:
                return 0  # nothing to forget: the file is left as it is
            self._state = forgotten
            if not self._write():
                raise OSError(self._write_error or f"cannot write {self.path}")
        return dropped

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
        owner = self._owner()
        if owner is not None:
            with contextlib.suppress(OSError):
                os.fchown(fd, *owner)
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
        if sig == self._signature or (sig is not None and sig == self._bad_signature):
            return
        if sig is None:
            self._state, self._signature = State(), None
            return
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            self._state, self._signature = State(), None
            return
        except OSError as exc:
            log.warning("state.unreadable", path=str(self.path), error=str(exc),
                        hint="starting without remembered good/bad profiles; check permissions")
            return
        try:
            if len(raw) > MAX_FILE_BYTES:
                raise StateFormatError(f"more than {MAX_FILE_BYTES} bytes")
            self._state = parse_text(raw)
            self._signature = sig
        except StateFormatError as exc:
            self._quarantine(str(exc), sig)
        except Exception as exc:  # whatever the content does to the parser
            self._quarantine(f"{type(exc).__name__}: {exc}"[:300], sig)

    def _quarantine(self, reason: str, sig: tuple[int, int, int] | None) -> None:
        aside = self.path.with_name(
            f"{self.file_name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
            moved: str | None = str(aside)
        except OSError:
            moved = None
            self._bad_signature = sig
        log.warning("state.corrupt", path=str(self.path), moved_to=moved, reason=reason[:300],
                    hint="starting without remembered good/bad profiles; the old file is kept for "
                         "inspection" if moved else "starting without remembered good/bad profiles; "
                         "the file could not be moved aside and is replaced at the next change")
        self._state, self._signature = State(), None
        self._prune_corrupt()

    def _prune_corrupt(self) -> None:
        """Keep the newest KEEP_CORRUPT moved-aside files: a disk that corrupts every write must
        not fill the directory."""
        with contextlib.suppress(OSError):
            old = sorted(self.directory.glob(f"{self.file_name}.corrupt-*"),
                         key=lambda p: p.stat().st_mtime, reverse=True)
            for path in old[KEEP_CORRUPT:]:
                path.unlink()

    def _owner(self) -> tuple[int, int] | None:
        """Run as root (`sudo sglang-supervisor forget`), files keep the owner of the existing
        file or directory: the service user must still read and replace them."""
        if os.geteuid() != 0:
            return None
        for path in (self.path, self.directory):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                return st.st_uid, st.st_gid
        return None

    def _write(self) -> bool:
        payload = json.dumps(to_json(self._state), indent=1, sort_keys=True).encode() + b"\n"
        tmp = self.path.with_name(f".{STATE_FILE}.{os.getpid()}.{id(self):x}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
            try:
                os.fchmod(fd, 0o640)  # whatever the umask says
                owner = self._owner()
                if owner is not None:
                    os.fchown(fd, *owner)
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
