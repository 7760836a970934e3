"""Which files the supervisor may believe: its configuration, its state and its credentials.

A file another user can write is a file another user can forge: a state entry that marks the best
profile bad, a config line that changes the command run as the service user, a key. Like ssh's
StrictModes, such a file is refused with the fix, never read and never moved aside (nothing the
operator had is lost). Pure: the shell passes what `stat` said.

Trusted owners are root and the user we run as; run as root, also the owner of the state
directory (the service user systemd's StateDirectory= made it for: `sudo sglang-supervisor check`
must not refuse the service's own files). A group may write a file only when it is one of ours
(a user-private group, the service's own group), the same way.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class FileFacts:
    path: str
    mode: int  # st_mode
    uid: int
    gid: int


@dataclass(frozen=True)
class Trusted:
    """Who may own, and which groups may write, the files we believe."""

    uids: frozenset[int]
    gids: frozenset[int]
    us: int  # our effective uid, for the fix

    @classmethod
    def for_process(cls, euid: int, egid: int, state_dir_owner: tuple[int, int] | None) -> Trusted:
        uids, gids = {0, euid}, {0, egid}
        if euid == 0 and state_dir_owner is not None:
            uids.add(state_dir_owner[0])
            gids.add(state_dir_owner[1])
        return cls(frozenset(uids), frozenset(gids), euid)


@dataclass(frozen=True)
class TrustProblem:
    problem: str
    fix: str


def trust_problem(what: str, facts: FileFacts, trusted: Trusted) -> TrustProblem | None:
    """Why `facts` (a file or directory holding `what`, e.g. "the state directory") must not be
    believed, with the exact command that fixes it; None when it may be."""
    mode = stat.S_IMODE(facts.mode)
    kind = "directory" if stat.S_ISDIR(facts.mode) else "file"
    path = facts.path
    if facts.uid not in trusted.uids:
        return TrustProblem(
            f"{path} ({what}) is owned by uid {facts.uid}, neither root nor this user "
            f"(uid {trusted.us}): that user could forge it",
            f"chown {trusted.us} {path} (or chown root), after checking its content; "
            f"ls -ln {path} shows the owner")
    if mode & stat.S_IWOTH:
        return TrustProblem(
            f"{path} ({what}) is writable by every user (mode {mode:04o}){_dir_note(kind)}",
            f"chmod o-w {path}")
    if mode & stat.S_IWGRP and facts.gid not in trusted.gids:
        return TrustProblem(
            f"{path} ({what}) is writable by group gid {facts.gid} (mode {mode:04o}), not one of "
            f"this service's{_dir_note(kind)}",
            f"chmod g-w {path} (or chgrp it to the service's group)")
    return None


def _dir_note(kind: str) -> str:
    return ": anyone could replace the files in it" if kind == "directory" else ""
