"""Profiles -> the exact SGLang command line and environment for one engine version (pure).

A profile overlays the engine's base flags (or the profile it `extends`); rendering then hands the
argv to the SGLang module, which migrates renamed flags for the target version and reports flags
that have no equivalent. The API key never enters argv or env: it goes into a small YAML file that
SGLang reads with `--config` (written by the caller, see `apikey.write_secret_config`).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from sglang_supervisor.core.config import (
    ArgValue,
    Config,
    ConfigError,
    ConfigProblem,
    Profile,
    did_you_mean,
    effective_overlay,
)
from sglang_supervisor.core.derive import Derivation
from sglang_supervisor.core.group import group_flags
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.engine.sglang import FlagProblem, Migration, migrate_args, migrate_env

__all__ = [
    "RenderedCommand",
    "command_hash",
    "config_problems",
    "default_secret_config_path",
    "detect_engine_version",
    "render",
    "render_all",
    "shell_format",
]

PYTHON_PLACEHOLDER = "{python}"
REDACTED = "<redacted>"
ENGINE_CONFIG_FLAG = "--config"
# Words that mark an environment variable or flag as a secret, for redaction in what we print.
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
_SECRET_FLAGS = ("--api-key", "--admin-api-key")


@dataclass(frozen=True)
class RenderedCommand:
    profile: str
    argv: list[str]
    env: dict[str, str]  # only what the configuration sets, on top of the supervisor's environment
    migrations: list[Migration] = field(default_factory=list)
    problems: list[FlagProblem] = field(default_factory=list)
    # {"api-key": KEY} for the caller to write (0600) at the path given after --config; None: no key
    secret_config: dict[str, str] | None = None

    @property
    def errors(self) -> list[FlagProblem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[FlagProblem]:
        return [p for p in self.problems if p.severity != "error"]

    def to_json(self) -> dict[str, object]:
        """The `render --format json` shape; secrets redacted."""
        return {
            "profile": self.profile,
            "argv": redact_argv(self.argv),
            "env": redact_env(self.env),
            "migrations": [
                {"old": m.old, "new": m.new, "since": m.since, "note": m.note} for m in self.migrations
            ],
            "problems": [
                {"flag": p.flag, "severity": p.severity, "message": p.message, "fix": p.fix}
                for p in self.problems
            ],
        }


def default_secret_config_path(config: Config, environ: Mapping[str, str]) -> str:
    """Where the 0600 `--config` file goes: runtime_dir, else systemd's $RUNTIME_DIRECTORY (tmpfs,
    removed with the service; `environ` is the supervisor's environment), else the state
    directory. The name ends in .yaml: SGLang requires it."""
    base = config.runtime_dir or environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or config.state_dir
    return posixpath.join(base, f"{config.name}-engine-secrets.yaml")


def flag_tokens(flag: str, value: ArgValue) -> list[str]:
    """One configured flag -> argv tokens: true = bare flag, false/None = left out, list = values."""
    if value is None or value is False:
        return []
    if value is True:
        return [f"--{flag}"]
    if isinstance(value, list):
        return [f"--{flag}", *(_scalar(v) for v in value)]
    return [f"--{flag}", _scalar(value)]


def _scalar(value: str | int | float) -> str:
    return str(value)


def base_command(config: Config, python: str) -> list[str]:
    return [part.replace(PYTHON_PLACEHOLDER, python) for part in config.engine.command]


def render(
    config: Config,
    profile: str,
    version: str,
    *,
    python: str = sys.executable,
    secret_config_path: str | None = None,
    api_key: str | None = None,
) -> RenderedCommand:
    """The command for `profile` on SGLang `version`.

    With an API key configured, argv ends in `--config <secret_config_path>` and `secret_config`
    holds the key. `api_key` supplies it: the key the shell read (`shell.engineproc.apikey.read_api_key`), or
    `REDACTED` from callers that only display. With a key configured it is required.
    """
    if profile not in config.profile_names:
        guess = did_you_mean(profile, config.profile_names)
        raise ConfigError(
            [ConfigProblem("profile", f"no profile is named {profile!r}",
                           (f"did you mean {guess!r}? " if guess else "")
                           + f"profiles: {', '.join(config.profile_names)}")],
            "render",
        )
    args, env = effective_overlay(config, profile)
    engine = config.engine
    flags = ["--model-path", engine.model_path, "--host", engine.host, "--port", str(engine.port)]
    if config.group is not None:  # SGLang's multi-node launch: the same command plus this node's rank
        flags += group_flags(config.group)
    for flag, value in args.items():
        flags += flag_tokens(flag, value)
    arg_m = migrate_args(flags, version)
    env_m = migrate_env(env, version)
    argv = base_command(config, python) + list(arg_m.args)
    secret: dict[str, str] | None = None
    if engine.has_api_key:
        if api_key is None:
            raise ValueError("render: the configuration has an API key; pass it as api_key "
                             "(shell.engineproc.apikey.read_api_key) or api_key=REDACTED")
        if secret_config_path is None:
            raise ValueError("render: the API key goes into a secret config file; pass its path "
                             "(default_secret_config_path)")
        argv += [ENGINE_CONFIG_FLAG, secret_config_path]
        secret = {"api-key": api_key}
    return RenderedCommand(
        profile=profile,
        argv=argv,
        env=dict(env_m.env),
        migrations=list(arg_m.migrations),
        problems=[*arg_m.problems, *env_m.warnings],
        secret_config=secret,
    )


def with_derived(config: Config, d: Derivation) -> Config:
    """`config` plus the derived profile `d` as a profile of its own: `d.base` extended by the
    derived change, so that it renders like any written rung."""
    profile = Profile(name=d.name, description=f"derived from {d.base}: {d.change}",
                      extends=d.base, remove=list(d.remove), args=dict(d.args))
    kept = [p for p in config.profiles if p.name != d.name]
    return config.model_copy(update={"profiles": [*kept, profile]})


def render_all(
    config: Config, version: str, *, python: str = sys.executable, api_key: str | None = None,
    secret_config_path: str | None = None,
) -> list[RenderedCommand]:
    return [render(config, p.name, version, python=python, api_key=api_key,
                   secret_config_path=secret_config_path) for p in config.profiles]


def _key_path(config: Config, profile: str, flag: str) -> str:
    """Where a flag or env variable of a rendered profile was written in the configuration."""
    name = flag.split("=", 1)[0].lstrip("-")
    chain: list[str] = []
    current: str | None = profile
    while current is not None and current not in chain:
        chain.append(current)
        current = config.profile(current).extends
    for pname in chain:
        p = config.profile(pname)
        i = config.profile_names.index(pname)
        if name in p.args:
            return f"profiles[{i}].args.{name}"
        if name in p.env:
            return f"profiles[{i}].env.{name}"
    if name in config.engine.args:
        return f"engine.args.{name}"
    if name in config.engine.env:
        return f"engine.env.{name}"
    return f"profiles[{config.profile_names.index(profile)}]"


def config_problems(config: Config, rc: RenderedCommand, version: str) -> list[ConfigProblem]:
    """A rendered profile's error-level flag problems as configuration problems (exit 78): the
    engine would refuse the command, so starting it is pointless."""
    return [
        ConfigProblem(_key_path(config, rc.profile, p.flag),
                      f"profile {rc.profile!r} on sglang {version}: {p.message}", p.fix)
        for p in rc.errors
    ]


# ---- printing -------------------------------------------------------------------------------


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = tok.partition("=")
        if name in _SECRET_FLAGS:
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(tok)
                hide_next = True
            continue
        out.append(tok)
    return out


def _is_value(tok: str) -> bool:
    return not tok.startswith("--")


def shell_format(rc: RenderedCommand) -> str:
    """A copy-pasteable command like the seed's: `ENV=v \\` then the command, one flag a line."""
    argv = redact_argv(rc.argv)
    first_flag = next((i for i, tok in enumerate(argv) if tok.startswith("--")), len(argv))
    lines = [f"{k}={shlex.quote(v)}" for k, v in redact_env(rc.env).items()]
    lines.append(shlex.join(argv[:first_flag]))
    i = first_flag
    while i < len(argv):
        group = [argv[i]]
        i += 1
        while i < len(argv) and _is_value(argv[i]):
            group.append(argv[i])
            i += 1
        lines.append(shlex.join(group))
    return " \\\n  ".join(lines)


def command_hash(rc: RenderedCommand) -> str:
    """Stable identity of what would run (argv + env); the API key itself is not part of it."""
    payload = json.dumps({"argv": rc.argv, "env": dict(sorted(rc.env.items()))}, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()
