"""docs/CONFIG.md documents every configuration key, with the default the code really uses."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from sglang_supervisor.core.config import Config
from sglang_supervisor.core.events import FailureClass

DOC = Path(__file__).resolve().parents[3] / "docs" / "CONFIG.md"
ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+) \|", re.MULTILINE)


def fields(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, object]:
    """key path -> default ("required" / "(section)" for those without a plain default)."""
    out: dict[str, object] = {}
    for name, info in model.model_fields.items():
        path = prefix + name
        tp = info.annotation
        sub = next((t for t in (tp, *typing.get_args(tp))
                    if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if info.default is not PydanticUndefined:
            out[path] = info.default
        elif info.default_factory is not None:
            value = info.default_factory()  # type: ignore[call-arg]
            out[path] = "(section)" if isinstance(value, BaseModel) else value
        else:
            out[path] = "required"
        if sub is not None:
            sep = "[]." if typing.get_origin(tp) is list else "."
            out.update(fields(sub, path + sep))
    return out


def documented() -> dict[str, str]:
    return {key: cell.strip() for key, cell in ROW.findall(DOC.read_text())}


def test_every_field_is_documented() -> None:
    missing = sorted(set(fields()) - set(documented()))
    assert missing == [], f"docs/CONFIG.md lacks: {missing}"


def test_documented_keys_exist() -> None:
    keys = set(fields()) | {fc.value for fc in FailureClass}
    unknown = sorted(set(documented()) - keys)
    assert unknown == [], f"docs/CONFIG.md documents keys the schema does not have: {unknown}"


def test_documented_defaults_match_the_code() -> None:
    doc = documented()
    for path, default in fields().items():
        cell = doc[path]
        if default in ("required", "(section)"):
            assert cell == default, path
        else:
            assert yaml.safe_load(cell.strip("`")) == default, (path, cell, default)


def test_every_failure_class_is_explained() -> None:
    doc = documented()
    assert sorted(fc.value for fc in FailureClass if fc.value not in doc) == []
