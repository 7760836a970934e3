"""The multi-node group's link secret (core/linkauth.py): read from `group.secret_file` or the
systemd credential `group.secret_credential`, refused like ssh refuses a private key when another
user could read or change it. Never from argv or the environment: both show in `ps e` and /proc.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from sglang_supervisor.core.config import ConfigError, ConfigProblem
from sglang_supervisor.core.group import SECRET_FILE_EXAMPLE, GroupSettings
from sglang_supervisor.core.linkauth import MAX_SECRET_CHARS, secret_problem
from sglang_supervisor.shell.engineproc.apikey import CREDENTIALS_ENV

SOURCE = "group secret"
CREATE = (f"create it (umask 077; openssl rand -hex 32 > {SECRET_FILE_EXAMPLE}) and copy the same "
          "file to every node of the group")
# Group-readable is allowed (640 with a dedicated group, as for the API key); group-writable or
# any access for others is not.
_REFUSED_BITS = stat.S_IWGRP | stat.S_IRWXO


def _problem(key: str, text: str, fix: str) -> ConfigError:
    return ConfigError([ConfigProblem(key, text, fix)], SOURCE)


def read_secret_file(path: str, key: str, *, fix_access: str | None = None) -> bytes:
    """The secret in `path` (a regular file, ours or root's, mode at most 640, one line of at least
    32 printable characters). ConfigError names the problem and the fix; it never quotes the file."""
    try:
        # O_NOFOLLOW is not used: Kubernetes mounts a Secret's files as symlinks into ..data/.
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        fix = CREATE if isinstance(exc, FileNotFoundError) else (
            fix_access or f"make it readable by the service user (uid {os.getuid()}): chown it to that user")
        raise _problem(key, f"cannot read {path}: {exc.strerror}", fix) from None
    try:
        st = os.fstat(fd)  # the file opened, not a name that may have been swapped since
        if not stat.S_ISREG(st.st_mode):
            raise _problem(key, f"{path} is not a regular file", "point it at the file holding the secret")
        mode = stat.S_IMODE(st.st_mode)
        if mode & _REFUSED_BITS:
            raise _problem(key, f"{path} is accessible to other users (mode {mode:04o}): they could "
                           "read the secret and forge the group's messages, or change it",
                           fix_access or f"chmod 600 {path} (or 640 with a dedicated group)")
        if st.st_uid not in (os.getuid(), 0):
            raise _problem(key, f"{path} is owned by uid {st.st_uid}, neither this service's user "
                           f"(uid {os.getuid()}) nor root: its owner could change the secret",
                           fix_access or f"chown root {path} (or the service user), chmod 600 {path}")
        raw = os.read(fd, MAX_SECRET_CHARS + 64)
    finally:
        os.close(fd)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise _problem(key, f"{path} is not ASCII text", CREATE) from None
    why = secret_problem(text)
    if why is not None:
        raise _problem(key, f"{path} {why}", CREATE)
    return text.strip().encode("ascii")


def read_group_secret(settings: GroupSettings, environ: Mapping[str, str] | None = None) -> bytes:
    """The group's link secret from the configured source."""
    env = os.environ if environ is None else environ
    if settings.secret_file is not None:
        return read_secret_file(settings.secret_file, "group.secret_file")
    name = settings.secret_credential
    assert name is not None  # GroupSettings requires one of the two
    directory = env.get(CREDENTIALS_ENV)
    fix = (f"add LoadCredential={name}:{SECRET_FILE_EXAMPLE} to the service unit (systemctl edit "
           "<unit>; systemd hands the service its own copy), or use group.secret_file when running "
           "by hand")
    if not directory:
        raise _problem("group.secret_credential",
                       f"credential {name!r} is configured but ${CREDENTIALS_ENV} is not set (the "
                       "supervisor is not running under systemd with a credential)", fix)
    return read_secret_file(os.path.join(directory, name), "group.secret_credential", fix_access=fix)
