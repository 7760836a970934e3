"""Multi-node groups: one supervisor per node, one profile per group (pure: settings and policy).

A model too large for one host runs as SGLang's multi-node launch: the same command on every node
plus `--nnodes N --node-rank R --dist-init-addr HOST:PORT`. Node 0 (the leader) serves the API;
the others run only their ranks and a dummy `/health` that always answers 200.

The supervisors coordinate through the leader's supervisor alone (no consensus of our own):

- the leader owns the group's *generation* (its lifecycle's attempt number) and *profile*, and
  publishes them on its group link (`GET /group`);
- a worker node's supervisor polls that view, starts its engine only at the start of a
  generation it has not yet claimed, stops it when the leader's engine stops or the leader is
  unreachable past `leader_timeout_s`, and reports its node's state (`POST /group/report`);
- the leader counts a worker's failure (or a worker that left the group) as its own engine's
  failure, so the existing ladder decides the next profile for the whole group, and gates READY on
  every worker node having ended its captures.

This module holds the parts that are pure: the configuration block, the rendered flags, the
parsing of the (untrusted) messages on the link and the decisions on both sides.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sglang_supervisor.core.config_report import FixableValueError
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.engine.graphs import rank_label

NODE_RANK_ENV = "SGLANG_SUPERVISOR_NODE_RANK"  # overrides group.node_rank (LeaderWorkerSet)
MAX_REPORT_BYTES = 4096  # a worker's report is a few hundred bytes; more is not a report
MAX_VIEW_BYTES = 16384
SECRET_FILE_EXAMPLE = "/etc/sglang-supervisor/group.secret"  # noqa: S105  (a path, no secret)
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class GroupSettings(BaseModel):
    """The `group:` block of the configuration (absent: a single-node engine)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nnodes: Annotated[int, Field(ge=2, le=64)]
    node_rank: Annotated[int, Field(ge=0, le=63)] = 0
    dist_init_addr: str  # the leader's torch.distributed store, HOST:PORT (SGLang's flag)
    link: str  # the leader supervisor's group link, HOST:PORT: the leader listens, workers call
    restart: Literal["group", "external"] = "group"
    leader_timeout_s: Annotated[float, Field(gt=0)] = 10.0  # worker: leader silent -> stop engine
    poll_interval_s: Annotated[float, Field(gt=0)] = 0.5
    # The link's shared secret (core/linkauth.py), one of the two: a file, or the name of a
    # systemd credential (LoadCredential=NAME:PATH). Never a value in the YAML, argv or env.
    secret_file: str | None = None
    secret_credential: str | None = None

    @model_validator(mode="after")
    def _secret(self) -> GroupSettings:
        if self.secret_file is not None and self.secret_credential is not None:
            raise FixableValueError("group.secret_file and group.secret_credential are both set",
                                    "keep one of them")
        if self.secret_file is None and self.secret_credential is None:
            raise FixableValueError(
                "a multi-node group needs a shared secret for its link (group.secret_file or "
                "group.secret_credential): without one anyone who reaches group.link can "
                "forge the nodes' reports",
                f"create it once (umask 077; openssl rand -hex 32 > {SECRET_FILE_EXAMPLE}), copy "
                f"the same file to every node (mode 600, owned by the service user) and set "
                f"group.secret_file: {SECRET_FILE_EXAMPLE} (docs/OPERATIONS.md, multi-node)")
        if self.secret_file is not None and not self.secret_file.startswith("/"):
            raise FixableValueError(f"group.secret_file {self.secret_file!r} is a relative path "
                                    "(systemd runs us in /)", "write the absolute path of the file")
        name = self.secret_credential
        if name is not None and (not name or "/" in name or name in {".", ".."}
                                 or not name.isprintable()):
            raise FixableValueError(f"group.secret_credential {name!r} is not a credential name",
                                    "give the NAME of LoadCredential=NAME:PATH, not a path")
        return self

    @model_validator(mode="after")
    def _shape(self) -> GroupSettings:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"group.node_rank {self.node_rank} must be below group.nnodes "
                             f"{self.nnodes}; set node_rank to 0 on the leader, 1..{self.nnodes - 1} "
                             "on the other nodes")
        for key, value in (("dist_init_addr", self.dist_init_addr), ("link", self.link)):
            m = _HOST_PORT.match(value)
            if not m or not 0 < int(m.group(2)) <= 65535:
                raise ValueError(f"group.{key} {value!r} is not HOST:PORT; write e.g. 10.0.0.1:5000")
        if self.link == self.dist_init_addr:
            raise ValueError("group.link and group.dist_init_addr must be different ports: the "
                             "engine's store listens on dist_init_addr")
        return self

    @property
    def leader(self) -> bool:
        return self.node_rank == 0


def with_node_rank(settings: GroupSettings, environ: Mapping[str, str]) -> GroupSettings:
    """`SGLANG_SUPERVISOR_NODE_RANK` (e.g. set from LWS_WORKER_INDEX) replaces group.node_rank,
    so one configuration serves every node. ValueError names the variable and the fix."""
    raw = environ.get(NODE_RANK_ENV, "").strip()
    if not raw:
        return settings
    if not raw.isdigit():
        raise ValueError(f"{NODE_RANK_ENV}={raw!r} is not a node rank; set it to 0..{settings.nnodes - 1}")
    return GroupSettings.model_validate({**settings.model_dump(), "node_rank": int(raw)})


def group_flags(settings: GroupSettings) -> list[str]:
    """The flags SGLang's multi-node launch needs on this node."""
    return ["--nnodes", str(settings.nnodes), "--node-rank", str(settings.node_rank),
            "--dist-init-addr", settings.dist_init_addr]


def node_rank_labels(tp_size: int, nnodes: int, node_rank: int) -> frozenset[str | None]:
    """The scheduler log prefixes on this node (SGLang's TP ranks are global across nodes)."""
    per = max(tp_size // nnodes, 1)
    ranks = range(per * node_rank, per * (node_rank + 1))
    return frozenset(rank_label(r, tp_size) for r in ranks)


# ---- messages on the link (untrusted: bounded, typed, never an exception) ----------------------

NodeState = Literal["idle", "starting", "serving", "failed"]
_STATES: tuple[str, ...] = ("idle", "starting", "serving", "failed")


@dataclass(frozen=True)
class Report:
    """A worker node's state, as it reports it to the leader."""

    node_rank: int
    instance: str  # random per worker-supervisor start: tells a restarted worker from the old one
    generation: int | None  # the generation its engine runs (None: no engine)
    state: NodeState
    failure_class: FailureClass | None = None
    message: str = ""
    captures_ended: int = 0
    captures_expected: int = 0

    def to_json(self) -> bytes:
        return json.dumps({
            "node_rank": self.node_rank, "instance": self.instance, "generation": self.generation,
            "state": self.state,
            "failure_class": self.failure_class.value if self.failure_class else None,
            "message": self.message[:300], "captures_ended": self.captures_ended,
            "captures_expected": self.captures_expected}).encode()


@dataclass(frozen=True)
class View:
    """The leader's published view of the group."""

    generation: int  # the leader's current attempt
    profile: str | None
    engine: Literal["none", "starting", "serving", "stopping"]
    restart: Literal["group", "external"]
    claimed: Mapping[int, str] = field(default_factory=dict)  # node rank -> instance in this generation

    def to_json(self) -> bytes:
        return json.dumps({"generation": self.generation, "profile": self.profile,
                           "engine": self.engine, "restart": self.restart,
                           "claimed": {str(k): v for k, v in self.claimed.items()}}).encode()


class MessageError(ValueError):
    """A message on the link that is not one: the reason, never a traceback."""


def _load(raw: bytes, limit: int) -> dict[str, object]:
    if len(raw) > limit:
        raise MessageError(f"message of {len(raw)} bytes exceeds {limit}")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MessageError("not a JSON object")
    return doc


def _int(doc: Mapping[str, object], key: str, lo: int, hi: int, *, optional: bool = False) -> int | None:
    v = doc.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise MessageError(f"{key} must be an integer in {lo}..{hi}")
    return v


def _str(doc: Mapping[str, object], key: str, limit: int) -> str:
    v = doc.get(key, "")
    if not isinstance(v, str) or len(v) > limit:
        raise MessageError(f"{key} must be a string of at most {limit} characters")
    return v


def parse_report(raw: bytes, nnodes: int) -> Report:
    doc = _load(raw, MAX_REPORT_BYTES)
    node = _int(doc, "node_rank", 1, nnodes - 1)
    state = doc.get("state")
    if state not in _STATES:
        raise MessageError(f"state must be one of {', '.join(_STATES)}")
    fc_raw = doc.get("failure_class")
    failure: FailureClass | None = None
    if fc_raw is not None:
        try:
            failure = FailureClass(str(fc_raw))
        except ValueError:
            failure = FailureClass.OTHER  # a newer worker's class: still a failure
    instance = _str(doc, "instance", 64)
    if not instance:
        raise MessageError("instance is required")
    assert node is not None
    return Report(node_rank=node, instance=instance,
                  generation=_int(doc, "generation", 0, 1 << 31, optional=True),
                  state=state,  # type: ignore[arg-type]  # checked against _STATES above
                  failure_class=failure, message=_str(doc, "message", 300),
                  captures_ended=_int(doc, "captures_ended", 0, 1 << 16, optional=True) or 0,
                  captures_expected=_int(doc, "captures_expected", 0, 1 << 16, optional=True) or 0)


def parse_view(raw: bytes) -> View:
    doc = _load(raw, MAX_VIEW_BYTES)
    gen = _int(doc, "generation", 0, 1 << 31)
    profile = doc.get("profile")
    if profile is not None and (not isinstance(profile, str) or len(profile) > 64):
        raise MessageError("profile must be a short string or null")
    engine = doc.get("engine")
    if engine not in ("none", "starting", "serving", "stopping"):
        raise MessageError("engine must be none, starting, serving or stopping")
    restart = doc.get("restart")
    if restart not in ("group", "external"):
        raise MessageError("restart must be group or external")
    claimed_raw = doc.get("claimed", {})
    if not isinstance(claimed_raw, dict) or len(claimed_raw) > 64:
        raise MessageError("claimed must be an object of at most 64 entries")
    claimed: dict[int, str] = {}
    for k, v in claimed_raw.items():
        if not (isinstance(k, str) and k.isdigit() and isinstance(v, str) and len(v) <= 64):
            raise MessageError("claimed maps node ranks to instance ids")
        claimed[int(k)] = v
    assert gen is not None
    return View(gen, profile, engine, restart, claimed)


# ---- the leader's side ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MemberFailed:
    """Count this as the group's engine failing (the worker node's class, or CHILD_CRASHED)."""

    node_rank: int
    failure_class: FailureClass
    message: str


@dataclass
class LeaderBook:
    """What the leader knows of its workers in the current generation (mutable, no I/O)."""

    nnodes: int
    generation: int = 0
    claimed: dict[int, str] = field(default_factory=dict)
    serving: set[int] = field(default_factory=set)
    failed: bool = False  # this generation already failed: later reports are fallout

    def new_generation(self, generation: int) -> None:
        self.generation = generation
        self.claimed = {}
        self.serving = set()
        self.failed = False

    def all_serving(self) -> bool:
        return self.serving >= set(range(1, self.nnodes))

    def missing(self) -> list[int]:
        return sorted(set(range(1, self.nnodes)) - self.serving)

    def on_report(self, r: Report, engine_running: bool) -> MemberFailed | None:
        """Record a report; a failure of the current generation's group, if it is one."""
        if self.failed:
            return None
        owner = self.claimed.get(r.node_rank)
        if r.generation == self.generation and owner in (None, r.instance):
            self.claimed[r.node_rank] = r.instance
            if r.state == "serving":
                self.serving.add(r.node_rank)
            if r.state == "failed":
                self.failed = True
                return MemberFailed(r.node_rank, r.failure_class or FailureClass.OTHER,
                                    r.message or f"node {r.node_rank} failed")
            return None
        if owner is not None and owner != r.instance and engine_running:
            # The node's supervisor restarted (or its engine is gone): its ranks left the group
            # and ours wait in a collective that never completes.
            self.failed = True
            return MemberFailed(r.node_rank, FailureClass.CHILD_CRASHED,
                                f"node {r.node_rank} left the group (its supervisor restarted)")
        if owner == r.instance and r.generation != self.generation and engine_running:
            self.failed = True
            return MemberFailed(r.node_rank, r.failure_class or FailureClass.CHILD_CRASHED,
                                f"node {r.node_rank} stopped its engine ({r.state})")
        return None


# ---- the worker's side ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Follow:
    """Start this generation's engine on this profile."""

    generation: int
    profile: str


@dataclass(frozen=True)
class StopLocal:
    reason: str


@dataclass(frozen=True)
class ExitGroup:
    """restart: external: leave it to the orchestrator (LeaderWorkerSet) to recreate the group."""

    reason: str


@dataclass(frozen=True)
class Wait:
    reason: str


WorkerAction = Follow | StopLocal | ExitGroup | Wait


def worker_decide(view: View | None, *, silent_s: float, leader_timeout_s: float,
                  instance: str, node_rank: int, running_generation: int | None,
                  engine_alive: bool, engine_failed: bool, restart: str) -> WorkerAction:
    """What a worker node does next, from the leader's last view and its own engine."""
    if view is None or silent_s > leader_timeout_s:
        if silent_s <= leader_timeout_s:
            return Wait("no answer from the leader yet")
        if restart == "external" and running_generation is not None:
            return ExitGroup(f"the leader has been unreachable for {silent_s:.1f} s")
        if engine_alive:
            return StopLocal(f"the leader has been unreachable for {silent_s:.1f} s")
        return Wait("the leader is unreachable")
    if engine_failed and restart == "external":
        return ExitGroup("this node's engine failed")
    if running_generation is not None and engine_alive:
        if view.generation != running_generation or view.engine in ("none", "stopping"):
            return StopLocal(f"the leader moved on to generation {view.generation} ({view.engine})")
        return Wait("serving")
    if view.engine == "starting" and view.profile and node_rank not in view.claimed \
            and view.generation != running_generation:
        return Follow(view.generation, view.profile)
    if view.claimed.get(node_rank) not in (None, instance):
        return Wait(f"generation {view.generation} started without this node; waiting for the next")
    return Wait(f"the leader's engine is {view.engine}")
