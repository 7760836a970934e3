"""The configuration's YAML: text -> plain data at a bounded cost, duplicate keys reported, and
each problem's key given its line in the file.

A hostile file (huge, an alias bomb, nested without end, a key twice) becomes a ConfigError
naming the problem and its fix, never an unbounded parse or a traceback. Pure: the text is an
argument.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from sglang_supervisor.core.config_report import ConfigError, ConfigProblem


class _Loader(yaml.SafeLoader):
    """SafeLoader that records duplicate keys (PyYAML silently keeps the last one)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[str, yaml.Mark]] = []
        self._checked: set[int] = set()

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: set[str] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if key_node.value in seen:
                    self.duplicates.append((key_node.value, key_node.start_mark))
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _line_index(text: str) -> dict[tuple[str, ...], int]:
    """Key path (as strings) -> 1-based line of that key, to point at the spot in the file."""
    index: dict[tuple[str, ...], int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return index
    stack: list[tuple[tuple[str, ...], yaml.Node]] = [((), root)] if root is not None else []
    visited: set[int] = set()
    while stack:
        path, node = stack.pop()
        if id(node) in visited:  # aliases can make the node graph cyclic
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    sub = (*path, str(k.value))
                    index.setdefault(sub, k.start_mark.line + 1)
                    stack.append((sub, v))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                sub = (*path, str(i))
                index.setdefault(sub, v.start_mark.line + 1)
                stack.append((sub, v))
    return index


def add_lines(problems: list[ConfigProblem], text: str) -> None:
    """Append the line of each problem's key ('line 12') when the file has it."""
    index = _line_index(text)
    for i, p in enumerate(problems):
        if not p.path or "line " in p.problem:
            continue
        parts = tuple(x for x in re.split(r"\.|\[(\d+)\]", p.path) if x)
        for n in range(len(parts), 0, -1):
            line = index.get(parts[:n])
            if line is not None:
                problems[i] = ConfigProblem(p.path, f"{p.problem} (line {line})", p.fix)
                break


def _yaml_error(exc: yaml.YAMLError, source: str, text: str) -> ConfigProblem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    if isinstance(exc, yaml.reader.ReaderError):  # a bad character: only a stream offset is known
        before = text[: exc.position]
        where = f"{source}:{before.count(chr(10)) + 1}:{len(before) - before.rfind(chr(10))}"
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    text = f"{context}, {what}" if context else str(what)
    return ConfigProblem(
        path="",
        problem=f"YAML syntax error at {where}: {text}",
        fix="fix the YAML at that line and column (indentation with spaces, 'key: value', "
        "quote strings that contain ': ' or start with a special character)",
    )


# A configuration is a few hundred values; aliases may repeat a block, not multiply it a billion
# times ("billion laughs": pydantic would walk every copy).
MAX_CONFIG_BYTES = 256 << 10  # qwen.yaml, comments and all, is 8 KiB; PyYAML parses ~50 KiB/s
MAX_EXPANDED_NODES = 50_000


def _expanded_size(root: yaml.Node) -> int:
    """Nodes the document has once every alias is expanded (memoised: linear in the graph);
    stops counting past MAX_EXPANDED_NODES. A cycle raises RecursionError like the constructor."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise RecursionError("an alias refers to itself")
        active.add(key)
        total = 1
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                children += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        for child in children:
            total += size(child)
            if total > MAX_EXPANDED_NODES:
                break
        active.discard(key)
        sizes[key] = total
        return total

    return size(root)


def read_yaml(text: str, source: str) -> tuple[object, list[ConfigProblem]]:
    loader: _Loader | None = None
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError([ConfigProblem("", f"the file holds {len(text)} characters; a configuration "
                                         f"is a few KiB (limit {MAX_CONFIG_BYTES})",
                                         "point --config at the supervisor's YAML file")], source)
    try:
        loader = _Loader(text)  # the reader already rejects control characters here
        node = loader.get_single_node()
        if node is not None and _expanded_size(node) > MAX_EXPANDED_NODES:
            raise ConfigError([ConfigProblem(
                "", f"aliases expand the document to more than {MAX_EXPANDED_NODES} values",
                "use anchors and aliases (&name, *name) for a few shared blocks, not nested repeats")],
                source)
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_error(exc, source, text)], source) from None
    except RecursionError:
        raise ConfigError(
            [ConfigProblem("", "the YAML is nested too deeply (or an alias refers to itself)",
                           "flatten the document; a supervisor config is at most four levels deep")],
            source,
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    problems = [
        ConfigProblem(
            path=key,
            problem=f"key {key!r} appears twice in one mapping (again at line {mark.line + 1}, "
            f"column {mark.column + 1}); YAML would silently keep only the last one",
            fix="keep one of them (merge their contents)",
        )
        for key, mark in loader.duplicates
    ]
    return data, problems
