"""Which installed code a process runs: the package version and the installed files' change time.

A package upgrade replaces the files under the running daemon (dh-virtualenv, scripts/install.sh);
a daemon left running (no-restart-on-upgrade, a policy-rc.d, a failed roll) keeps the old code in
memory. It stamps the code once at start and compares on every `/status`: `code_stale` says so.
"""

from __future__ import annotations

from pathlib import Path

import sglang_supervisor

# Files every upgrade rewrites: the package's marker and the CLI's module.
_STAMPED = ("__init__.py", "cli.py")


def code_stamp() -> str:
    root = Path(sglang_supervisor.__file__).parent
    parts = [sglang_supervisor.__version__]
    for name in _STAMPED:
        try:
            st = (root / name).stat()
        except OSError:
            parts.append("missing")
            continue
        parts.append(f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}")
    return "|".join(parts)
