"""The other models configured on this host, read for `check`'s collision report and for
`copy-config`'s choice of free ports (core/hostclash.py decides; this only reads files).

The host's models are the `*.yaml` files beside the configuration (the units read
/etc/sglang-supervisor/NAME.yaml). A file that does not validate or cannot be read is not
compared; it is named in a warning, never a reason to refuse this model.
"""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.core.config import Config, ConfigError, ConfigProblem
from sglang_supervisor.core.hostclash import ModelClaims, claims_of, clashes
from sglang_supervisor.shell.files.configfile import load_config

# A directory of thousands of files is not a host's models: compare the first ones only.
MAX_MODELS = 64


def other_models(directory: Path, *, exclude: Path | None = None) -> tuple[list[ModelClaims], list[str]]:
    """Claims of every loadable configuration in `directory` except `exclude`, and a warning for
    each file left out."""
    claims: list[ModelClaims] = []
    notes: list[str] = []
    mine = exclude.resolve() if exclude is not None else None
    try:
        files = sorted(p for p in directory.glob("*.yaml") if p.is_file())
    except OSError as exc:
        return [], [f"other models not compared: cannot list {directory}: {exc.strerror}"]
    if len(files) > MAX_MODELS:
        notes.append(f"only the first {MAX_MODELS} of {len(files)} configurations in {directory} compared")
        files = files[:MAX_MODELS]
    for path in files:
        if mine is not None and path.resolve() == mine:
            continue
        try:
            config = load_config(path, on_warning=lambda _w: None)
        except ConfigError as exc:
            first = exc.problems[0].problem if exc.problems else "invalid"
            notes.append(f"not compared with {path}: {first} (sglang-supervisor check --config {path})")
            continue
        claims.append(claims_of(config, str(path)))
    return claims, notes


def host_problems(config: Config, path: str) -> tuple[list[ConfigProblem], list[str]]:
    """This model's clashes with the host's other models, and the files that were not compared."""
    here = Path(path)
    others, notes = other_models(here.parent, exclude=here)
    return clashes(claims_of(config, path), others), notes
