"""The files a configuration makes the supervisor believe, checked with `core.filetrust`:
the configuration file itself, the state directory and the state files in it, and the key files.
Each refusal is a `ConfigProblem` (exit 78 at `check`, `run`, `doctor` and a reload)."""

from __future__ import annotations

import os

from sglang_supervisor.core.config import Config, ConfigProblem
from sglang_supervisor.core.filetrust import FileFacts, Trusted, trust_problem
from sglang_supervisor.shell.files.state import releases_path, request_path, state_file_name

# Files in the state directory whose content decides something (the lock files decide nothing).
GATEWAY_RECORD = "gateway.json"
SHARED_STATE = "state.json"


def _facts(path: str) -> FileFacts | None:
    try:
        st = os.stat(path)
    except OSError:
        return None  # missing or unreachable: another check (or the store) says so
    return FileFacts(path, st.st_mode, st.st_uid, st.st_gid)


def trusted_here(state_dir: str) -> Trusted:
    owner = _facts(state_dir)
    return Trusted.for_process(os.geteuid(), os.getegid(),
                               None if owner is None else (owner.uid, owner.gid))


def problems_of(named: list[tuple[str, str, str]], trusted: Trusted) -> list[ConfigProblem]:
    """(config key path, file path, what it holds) -> one problem per untrusted file."""
    out: list[ConfigProblem] = []
    for key, path, what in named:
        facts = _facts(path)
        if facts is None:
            continue
        problem = trust_problem(what, facts, trusted)
        if problem is not None:
            out.append(ConfigProblem(key, problem.problem, problem.fix))
    return out


def untrusted_files(config: Config) -> list[ConfigProblem]:
    """The state directory, the state files and key files of a valid configuration."""
    state_dir = config.state_dir
    named = [("state_dir", state_dir, "the state directory")]
    for name in dict.fromkeys((state_file_name(config.name), SHARED_STATE, GATEWAY_RECORD)):
        named.append(("state_dir", os.path.join(state_dir, name), "remembered profiles"
                      if name != GATEWAY_RECORD else "the gateway registration"))
    # The upgrade canary's memory and `upgrade --now`'s request (which names an interpreter the
    # daemon runs): whoever may write them chooses what the engine runs.
    named.append(("state_dir", str(releases_path(config)), "the release memory"))
    named.append(("state_dir", str(request_path(config)), "an upgrade request"))
    for key, path in (("engine.api_key_file", config.engine.api_key_file),
                      ("gateway.api_key_file", config.gateway.api_key_file)):
        if path is not None and os.path.isabs(path):
            named.append((key, path, "an API key"))
    return problems_of(named, trusted_here(state_dir))


def untrusted_config_file(path: str, state_dir: str) -> list[ConfigProblem]:
    """The configuration file itself (`state_dir` from its text, for the owner rule under
    root): anyone who can write it chooses the command run as the service user."""
    return problems_of([("", path, "the configuration")], trusted_here(state_dir))
