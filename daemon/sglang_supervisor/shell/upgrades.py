"""The upgrade canary's shell (issue 24): the release memory of one model, the candidate a reload
puts on trial, the verdicts the lifecycle reaches (core/canary.py), and an in-place upgrade seen
at start-up (the version that served from this interpreter differs from the installed one).

The memory is `NAME.releases.json` beside the state file: what each release measured at READY per
profile (the reference a candidate is judged against), every candidate's verdict (bounded), the
promoted candidate (the daemon keeps running it across restarts while the configuration names it
in `engine.candidate.python`), and the last in-place upgrade. A file it cannot use is moved aside
and the memory starts empty; it is never a reason not to serve.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from sglang_supervisor.core.actions import CanaryJudged, RollBack
from sglang_supervisor.core.canary import FIDELITY_NOT_CHECKED, CanaryPlan, Reference, judge
from sglang_supervisor.core.config import Config
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.upgradeplan import candidate_config
from sglang_supervisor.engine.detect import engine_interpreter
from sglang_supervisor.shell.current import Current
from sglang_supervisor.shell.files.state import releases_path, request_path
from sglang_supervisor.shell.telemetry.metrics import SupervisorMetrics

log = structlog.get_logger("sglang_supervisor")

SCHEMA = 1
MAX_FILE_BYTES = 256 << 10
MAX_RELEASES = 32  # verdicts kept, newest last
MAX_REFERENCE_VERSIONS = 8
MAX_TEXT = 500


def venv_identity(python: str) -> str:
    """The candidate's venv as it is now: its interpreter and the mtimes of its site-packages
    and of the interpreter (a `pip install` there changes them), so a rolled-back candidate is tried again
    only once its venv changed."""
    real = os.path.realpath(python)
    venv = Path(real).parent.parent
    stamps: list[int] = []
    for pattern in ("lib/python*/site-packages", "lib64/python*/site-packages"):
        for d in venv.glob(pattern):
            with contextlib.suppress(OSError):
                stamps.append(d.stat().st_mtime_ns)
    with contextlib.suppress(OSError):
        stamps.append(os.stat(real).st_mtime_ns)
    return f"{real}@{'.'.join(str(t) for t in stamps) or 0}"


def _text(v: object) -> str | None:
    return v[:MAX_TEXT] if isinstance(v, str) else None


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if 0 <= f < 1e12 else None


def _clean(raw: object) -> dict[str, Any]:
    """The parts of an untrusted file we can use, typed and bounded; the rest is dropped."""
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise ValueError("not a releases file of this schema")
    out: dict[str, Any] = {"schema": SCHEMA, "references": {}, "releases": [], "promoted": None,
                           "last_seen": None, "in_place": None}
    refs = raw.get("references")
    if isinstance(refs, dict):
        for version, by_profile in list(refs.items())[-MAX_REFERENCE_VERSIONS:]:
            if isinstance(version, str) and isinstance(by_profile, dict):
                out["references"][version[:64]] = {
                    str(p)[:256]: {"tok_s": _num(r.get("tok_s")), "ttft_s": _num(r.get("ttft_s")),
                                   "at": _num(r.get("at")), "old_release": r.get("old_release") is True}
                    for p, r in list(by_profile.items())[:256] if isinstance(r, dict)}
    releases = raw.get("releases")
    if isinstance(releases, list):
        for r in releases[-MAX_RELEASES:]:
            if isinstance(r, dict):
                out["releases"].append({k: (_num(v) if isinstance(v, int | float) else _text(v))
                                        for k, v in list(r.items())[:32] if isinstance(k, str)})
    for key in ("promoted", "last_seen", "in_place"):
        v = raw.get(key)
        if isinstance(v, dict):
            out[key] = {k: (_num(x) if isinstance(x, int | float) else _text(x))
                        for k, x in list(v.items())[:32] if isinstance(k, str)}
    return out


def empty() -> dict[str, Any]:
    return _clean({"schema": SCHEMA})


def load(path: Path) -> dict[str, Any]:
    """The release memory at `path`; empty when there is none, or when it cannot be used (then
    moved aside as `PATH.corrupt-TIME`, with a warning)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return empty()
    except OSError as exc:
        log.warning("upgrade.memory_unreadable", path=str(path), error=exc.strerror)
        return empty()
    try:
        if len(raw) > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
        return _clean(json.loads(raw))
    except (ValueError, RecursionError) as exc:
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        log.warning("upgrade.memory_corrupt", path=str(path), moved_to=str(aside),
                    reason=str(exc)[:200], hint="the release history starts empty")
        return empty()


def save(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        log.warning("upgrade.memory_write_failed", path=str(path), error=str(exc)[:200])


def read_request(config: Config) -> dict[str, Any] | None:
    """`upgrade --now`'s request ({python, retry}), or None."""
    try:
        with request_path(config).open("rb") as f:
            raw = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("python"), str):
        return None
    return {"python": raw["python"][:MAX_TEXT], "retry": raw.get("retry") is True}


def write_request(config: Config, python: str, retry: bool) -> Path:
    """The request, owned like the state directory (run as root, the service user must read it
    and remove it once judged). Raises OSError when it cannot be written."""
    path = request_path(config)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
    with os.fdopen(fd, "w") as f:
        json.dump({"python": python, "retry": retry, "at": time.time()}, f)
        if os.geteuid() == 0:
            st = path.parent.stat()
            os.fchown(f.fileno(), st.st_uid, st.st_gid)
    os.replace(tmp, path)
    return path


def candidate_python(config: Config) -> tuple[str | None, bool]:
    """The candidate a reload or a start considers: `upgrade --now`'s request, else
    `engine.candidate.python`; and whether the operator asked to retry it."""
    req = read_request(config)
    if req is not None:
        return req["python"], bool(req["retry"])
    return config.engine.candidate.python, False


def startup_config(config: Config) -> Config:
    """At start: the promoted candidate when the configuration (or a request) still names it, so
    a restart keeps the release the canary proved; else `config` as written."""
    python, _ = candidate_python(config)
    promoted = load(releases_path(config)).get("promoted") or {}
    if python and promoted.get("python") == python:
        log.info("upgrade.promoted_in_use", python=python, version=promoted.get("version"),
                 hint="move engine.command to this venv and remove engine.candidate to make it "
                      "the configured release")
        return candidate_config(config, python)
    return config


class Upgrades:
    """The supervisor's part: reference numbers at READY, the canary's verdicts, the in-place
    case, and what /status, metrics and STATUS= show."""

    def __init__(self, current: Current, lifecycle: Lifecycle, metrics: SupervisorMetrics) -> None:
        self.current, self.lifecycle, self.metrics = current, lifecycle, metrics
        self.path = releases_path(current.config)
        self.book = load(self.path)
        self.pending: CanaryPlan | None = None  # a canary under way
        self.in_place: CanaryPlan | None = None  # judged at the first READY, no rollback
        self._check_in_place()

    # -- what the daemon runs now ---------------------------------------------------------
    def interpreter(self, config: Config | None = None) -> str:
        return engine_interpreter(config or self.current.config)

    def _check_in_place(self) -> None:
        seen = self.book.get("last_seen") or {}
        python, version = self.interpreter(), self.current.prep.version
        old = seen.get("version")
        if seen.get("python") != python or not old or old == version:
            return
        refs = self.book["references"].get(old, {})
        for r in refs.values():
            r["old_release"] = True  # the evidence stays, marked: that release is gone
        profile = self.current.config.profile_names[0]
        ref = refs.get(profile) or next(iter(refs.values()), None)
        self.in_place = CanaryPlan(
            old, version, python,
            Reference(old, profile, ref.get("tok_s"), ref.get("ttft_s")) if ref else None,
            self.current.config.upgrade.min_tps_ratio, self.current.config.upgrade.max_ttft_ratio,
            rollback_possible=False)
        self.book["in_place"] = {"from": old, "to": version, "python": python, "at": time.time(),
                                 "verdict": "in_progress"}
        save(self.path, self.book)
        log.error("upgrade.in_place", python=python, old_version=old, new_version=version,
                  hint=f"SGLang was upgraded in place ({old} -> {version}) in the venv the engine "
                       "runs from: there is no old release to roll back to. It is judged like a "
                       "canary at READY against the old release's numbers (kept in "
                       f"{self.path}); install the next candidate as a second venv and use "
                       "`sglang-supervisor upgrade` (docs/OPERATIONS.md, Upgrading SGLang)")
        self.metrics.set_upgrade("in_place", version)

    # -- the canary -------------------------------------------------------------------------
    def candidate(self, config: Config) -> tuple[str | None, bool]:
        """(the candidate interpreter this reload runs, whether it is a canary), or (None, False)
        for a reload of the configured release. A promoted candidate runs without a canary; a
        rolled-back one is not retried until its venv changes or the operator asks."""
        python, retry = candidate_python(config)
        if not python:
            return None, False
        promoted = self.book.get("promoted") or {}
        if promoted.get("python") == python:
            return python, False
        if python == self.interpreter(config):
            # the configured release already is that venv: a request for it is done
            with contextlib.suppress(OSError):
                request_path(config).unlink()
            return None, False
        identity = venv_identity(python)
        last = next((r for r in reversed(self.book["releases"]) if r.get("python") == python), None)
        if last is not None and last.get("verdict") != "promoted" and not retry and (
                last.get("identity") == identity):
            log.warning("upgrade.not_retried", python=python, verdict=last.get("verdict"),
                        reason=last.get("reason"),
                        hint="this candidate was rolled back and its venv has not changed since; "
                             "`sglang-supervisor upgrade --retry` asks for another trial")
            return None, False
        return python, True

    def plan(self, python: str, candidate_version: str) -> CanaryPlan:
        cur = self.current
        current, profile = cur.prep.version, self.lifecycle.profile or cur.config.profile_names[0]
        ref = self.book["references"].get(current, {}).get(profile)
        return CanaryPlan(current, candidate_version, python,
                          Reference(current, profile, ref.get("tok_s"), ref.get("ttft_s"))
                          if ref else None,
                          cur.config.upgrade.min_tps_ratio, cur.config.upgrade.max_ttft_ratio)

    def begin(self, plan: CanaryPlan | None) -> CanaryPlan | None:
        """A canary starts (`plan`; None: a plain reload): say so, and hand it on."""
        if plan is None:
            return None
        self.pending = plan
        log.warning("upgrade.canary_begin", current=plan.current, candidate=plan.candidate,
                    python=plan.python, reference_tok_s=plan.reference.tok_s if plan.reference
                    else None, profile=plan.reference.profile if plan.reference else None)
        self.metrics.set_upgrade("in_progress", plan.candidate)
        return plan

    def refused(self, python: str, version: str, reason: str) -> None:
        """The candidate cannot run the tuned profile: rolled back before any start."""
        self._record(python, version, "refused", reason, None)
        self.metrics.set_upgrade("refused", version)

    def judged(self, a: CanaryJudged) -> None:
        v = a.verdict
        self._record(a.plan.python, a.plan.candidate, v.word, v.reason, a.verdict.to_json(),
                     from_version=a.plan.current)
        self.metrics.set_upgrade(v.word, a.plan.candidate, v.tps_ratio)
        self.pending = None  # judged: a rollback that follows records nothing more
        if v.promote:
            # `upgrade --now`'s request stays: it names the promoted release for later starts
            self.book["promoted"] = {"python": a.plan.python, "version": a.plan.candidate,
                                     "from": a.plan.current, "at": time.time()}
            save(self.path, self.book)
            return
        with contextlib.suppress(OSError):
            request_path(self.current.config).unlink()

    def rolled_back(self, a: RollBack) -> None:
        """The candidate failed to start, or measured worse (its stop): the current release
        serves again; the verdict stays in the history."""
        plan, self.pending = self.pending, None
        if plan is None:
            return
        if a.failure_class != "canary_rejected":
            self._record(plan.python, plan.candidate, "rolled_back",
                         f"failed to start: {a.failure_class}: {a.message}", None,
                         from_version=plan.current)
            self.metrics.set_upgrade("rolled_back", plan.candidate)
        with contextlib.suppress(OSError):
            request_path(self.current.config).unlink()

    def _record(self, python: str, version: str, verdict: str, reason: str,
                numbers: Mapping[str, Any] | None, *, from_version: str | None = None) -> None:
        entry: dict[str, Any] = {"python": python, "version": version, "verdict": verdict,
                                 "reason": reason[:MAX_TEXT], "identity": venv_identity(python),
                                 "from": from_version or self.current.prep.version, "at": time.time(),
                                 "fidelity": FIDELITY_NOT_CHECKED}
        for k, v in (numbers or {}).items():
            if k not in ("verdict", "reason") and v is not None:
                entry[k] = v
        self.book["releases"] = [*self.book["releases"], entry][-MAX_RELEASES:]
        save(self.path, self.book)

    # -- READY -----------------------------------------------------------------------------
    def on_ready(self, profile: str, tok_s: float | None, ttft_s: float | None,
                 fidelity: str = FIDELITY_NOT_CHECKED) -> None:
        """Every READY: this release's reference for `profile`; the first after an in-place
        upgrade is judged too (there is nothing to roll back to). `fidelity`: what the ready
        gate's check found (a mismatch never reaches READY, so `pass` or `not_checked`)."""
        version = self.current.prep.version
        if tok_s is not None:
            refs = self.book["references"]
            refs.setdefault(version, {})[profile] = {"tok_s": tok_s, "ttft_s": ttft_s,
                                                      "at": time.time(), "old_release": False}
            while len(refs) > MAX_REFERENCE_VERSIONS:
                refs.pop(next(iter(refs)))
        self.book["last_seen"] = {"python": self.interpreter(), "version": version}
        if self.in_place is not None:
            plan, self.in_place = self.in_place, None
            v = judge(plan, tok_s, ttft_s, fidelity=fidelity)
            word = "in_place_ok" if v.promote else "in_place_worse"
            level = log.warning if v.promote else log.error
            level("upgrade.in_place_verdict", verdict=word, old_version=plan.current,
                  new_version=plan.candidate, **{k: x for k, x in v.to_json().items()
                                                 if k != "verdict"},
                  hint="an in-place upgrade cannot be rolled back: reinstall the old release "
                       "into a second venv to go back")
            self.book["in_place"] = {**(self.book.get("in_place") or {}), "verdict": word,
                                     "reason": v.reason}
            self._record(plan.python, plan.candidate, word, v.reason, v.to_json(),
                         from_version=plan.current)
            self.metrics.set_upgrade(word, plan.candidate, v.tps_ratio)
            return
        save(self.path, self.book)

    # -- what operators see ----------------------------------------------------------------
    def note(self) -> str | None:
        if self.pending is not None:
            return (f"upgrade canary: SGLang {self.pending.current} -> {self.pending.candidate} "
                    "on trial")
        if self.in_place is not None:
            return (f"in-place upgrade {self.in_place.current} -> {self.in_place.candidate}: "
                    "no rollback possible")
        return None

    def status(self) -> dict[str, Any]:
        last = self.book["releases"][-1] if self.book["releases"] else None
        return {"pid": os.getpid(), "in_progress": None if self.pending is None else {
                    "current": self.pending.current, "candidate": self.pending.candidate,
                    "python": self.pending.python},
                "in_place": self.book.get("in_place"), "promoted": self.book.get("promoted"),
                "last_verdict": last, "releases": len(self.book["releases"]),
                # the last candidate's answers against the model's fidelity reference
                "fidelity": last.get("fidelity") if last else None}
