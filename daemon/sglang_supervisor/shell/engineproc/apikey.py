"""The API key: read from a file or a systemd credential, handed to SGLang in a 0600 YAML file.

SGLang would print a key given as `--api-key` in the process table, its log and /server_info; a
`--config` file keeps it off argv. The file is created with mode 0600 from the first byte (never a
chmod after the fact) and swapped into place atomically.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import yaml

from sglang_supervisor.core.config import ConfigError, ConfigProblem, EngineSettings
from sglang_supervisor.core.secretforms import KEY_FIX, api_key_problem

CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"


FILE_FIX = "create the file (chmod 600, owned by the service user) or fix the path"


def credential_fix(name: str) -> str:
    """systemd copies a credential for the service itself (readable by it, whatever the source's
    mode): the fix is the unit's LoadCredential= line, never a chmod of the file."""
    return (f"give the unit LoadCredential={name}:/etc/sglang-supervisor/<file> naming a file root can "
            "read (systemctl edit <unit>; systemd hands the service its own copy, no chmod or chown), "
            f"or set engine.api_key_credential to the name LoadCredential= uses")


def _key_from(path: str, key_path: str, source: str, fix: str = FILE_FIX) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [ConfigProblem(key_path, f"cannot read the API key from {path}: {exc.strerror}", fix)],
            source,
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            [ConfigProblem(key_path, f"{path} is not UTF-8 text", "write the key as plain text")], source
        ) from None
    key = text.strip()
    if not key:
        raise ConfigError(
            [ConfigProblem(key_path, f"{path} is empty", "write the API key into the file (one line)")],
            source,
        )
    if "\n" in key or "\r" in key:
        raise ConfigError(
            [ConfigProblem(key_path, f"{path} holds several lines",
                           "keep only the key, on one line, in the file")],
            source,
        )
    problem = api_key_problem(key)
    if problem is not None:
        raise ConfigError([ConfigProblem(key_path, f"{path}: {problem}", KEY_FIX)], source)
    return key


def read_api_key(engine: EngineSettings, environ: Mapping[str, str] | None = None) -> str | None:
    """The configured API key, or None when none is configured. ConfigError says what is wrong."""
    env = os.environ if environ is None else environ
    if engine.api_key_file is not None:
        return _key_from(engine.api_key_file, "engine.api_key_file", "API key")
    if engine.api_key_credential is not None:
        name = engine.api_key_credential
        directory = env.get(CREDENTIALS_ENV)
        if not directory:
            raise ConfigError(
                [ConfigProblem("engine.api_key_credential",
                               f"credential {name!r} is configured but ${CREDENTIALS_ENV} is not set "
                               "(the supervisor is not running under systemd with a credential)",
                               f"add LoadCredential={name}:/path/to/key to the service unit, or use "
                               "engine.api_key_file when running by hand")],
                "API key",
            )
        return _key_from(os.path.join(directory, name), "engine.api_key_credential", "API key",
                         credential_fix(name))
    return None


def write_secret_config(path: str | Path, mapping: Mapping[str, str]) -> None:
    """Write `mapping` as SGLang `--config` YAML at `path`, mode 0600, atomically.

    The temporary file is created 0600 by `mkstemp` in the target directory, so the secret is
    never readable by others, not even between creation and the rename.
    """
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = yaml.safe_dump(dict(mapping), default_flow_style=False, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)  # mkstemp already uses 0600; state it, whatever the platform
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_secret_config(path: str | Path) -> None:
    """Delete the file when the engine is gone (missing is fine)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
