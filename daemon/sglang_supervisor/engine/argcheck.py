"""Check argv lists against the REAL SGLang argument parser, in the engine's own interpreter.

Run as a script by the engine's python (never imported by the supervisor's code paths that need
it, and it imports nothing from sglang_supervisor, so it works in any venv that has sglang):

    echo '{"argvs": {"p1": ["--tp-size", "2"]}, "list_options": false}' | python sglang_argcheck.py

It builds `argparse.ArgumentParser()` + `ServerArgs.add_cli_args(p)` and runs `parse_known_args`,
which validates types and choices without GPU, model or network. Prints one JSON object:
    {"ok": true, "version": "0.5.23", "results": {"p1": {"unknown": [...], "error": null,
     "abbreviations": {"--tp": "--tp-size"}}}, "options": [...]}
or {"ok": false, "error": "...", "missing": "sglang"} when sglang cannot be imported.
Exit code is 0 in both cases (the JSON says what happened); 2 only for unreadable input.
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts this file's folder first on sys.path, and our package's modules
# (sglang.py beside this file above all) would shadow third-party ones that sglang or its
# dependencies import by the same top-level name. (No module here shadows the stdlib any more:
# tests/unit/test_module_names.py keeps it so; the third-party names cannot be ruled out.)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib.metadata  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
from typing import Any  # noqa: E402


class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str) -> Any:  # argparse's signature returns NoReturn
        raise _ParseError(message)


def _build(allow_abbrev: bool, server_args: Any) -> _Parser:
    p = _Parser(allow_abbrev=allow_abbrev, add_help=False)
    server_args.add_cli_args(p)
    return p


def _flags(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


def check(argvs: dict[str, list[str]], list_options: bool) -> dict[str, Any]:
    try:
        # SGLang logs and warns at import time; keep stdout clean for our JSON.
        with contextlib.redirect_stdout(io.StringIO()):
            from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]  # noqa: PLC0415
    except Exception as e:  # ImportError, missing torch/triton, a broken install...
        return {"ok": False, "missing": "sglang", "error": f"{type(e).__name__}: {e}"}
    try:
        version: str | None = importlib.metadata.version("sglang")
    except Exception:
        version = None
    real = _build(True, ServerArgs)
    strict = _build(False, ServerArgs)
    options = sorted(o for o in real._option_string_actions if o.startswith("--"))
    results: dict[str, Any] = {}
    for name, argv in argvs.items():
        res: dict[str, Any] = {"unknown": [], "error": None, "abbreviations": {}}
        try:
            _, unknown = real.parse_known_args(list(argv))
            res["unknown"] = unknown
        except _ParseError as e:
            res["error"] = str(e)
        # A flag the real parser accepts only as a unique prefix is an abbreviation: legal, but a
        # typo of a longer flag can hide behind it.
        try:
            _, unknown_strict = strict.parse_known_args(list(argv))
        except _ParseError:
            unknown_strict = []
        accepted_by_prefix = set(_flags(unknown_strict)) - set(_flags(res["unknown"]))
        for tok in sorted(accepted_by_prefix):
            full = [o for o in options if o.startswith(tok)]
            res["abbreviations"][tok] = full[0] if len(full) == 1 else None
        results[name] = res
    out: dict[str, Any] = {"ok": True, "version": version, "results": results}
    if list_options:
        out["options"] = options
        # the spellings of one option (aliases, and BooleanOptionalAction's --no- form)
        out["option_groups"] = [list(a.option_strings) for a in real._actions
                                if sum(o.startswith("--") for o in a.option_strings) > 1]
    return out


def main() -> int:
    try:
        req = json.loads(sys.stdin.read() or "{}")
        argvs = {str(k): [str(a) for a in v] for k, v in (req.get("argvs") or {}).items()}
    except (ValueError, AttributeError, TypeError) as e:
        print(json.dumps({"ok": False, "error": f"bad request: {e}"}))
        return 2
    print(json.dumps(check(argvs, bool(req.get("list_options")))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
