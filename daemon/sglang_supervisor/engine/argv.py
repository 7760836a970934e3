"""The one reader of an SGLang command line: which value does the engine see for a flag.

The READY gate (which graphs to wait for), the doctor (which rules apply), the supervisor (how many
GPUs, how often the engine prints decode stats) all read a rendered argv; they read it here, with
argparse's rules: `--opt=value` or `--opt value...`; a token that starts with `--` is the next
option (a negative number such as `-1` is a value); the last occurrence of an option wins; with a
catalogue, an unambiguous prefix stands for the full option, as argparse's allow_abbrev does; an
alias SGLang declares for an option (`--decode-context-parallel-size` for `--dcp-size`) is read as
that option.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sglang_supervisor.engine.sglang import FlagCatalog

# The tensor-parallel size, and `--tp`: the abbreviation argparse expands, in a command read without
# a catalogue (its alias `--tensor-parallel-size` is read as `--tp-size`: ALIASES).
TP_FLAGS = ("--tp-size", "--tp")
# The other spellings argparse takes for one SGLang option (declared side by side), mapped to the
# one this package reads. Without this, `--decode-context-parallel-size 2` would make the READY gate
# wait for a prefill capture that SGLang never runs. tests/compat checks it against the real parser
# of every release installed there.
ALIASES: Mapping[str, str] = {
    "--model": "--model-path",
    "--tensor-parallel-size": "--tp-size",
    "--data-parallel-size": "--dp-size",
    "--pipeline-parallel-size": "--pp-size",
    "--decode-context-parallel-size": "--dcp-size",
    "--attention-context-parallel-size": "--attn-cp-size",
    "--attention-data-parallel-size": "--attn-dp-size",
    "--moe-data-parallel-size": "--moe-dp-size",
    "--expert-parallel-size": "--ep-size",
    "--ep": "--ep-size",
    "--nccl-init-addr": "--dist-init-addr",
    "--speculative-draft-model": "--speculative-draft-model-path",
    "--hierarchical-sparse-attention-extra-config": "--hisparse-config",
    "--grpc-http-sidecar-port": "--smg-http-sidecar-port",
    "--context-bucket": "--cuda-graph-prefill-max-context",
    "--enable-hicache": "--enable-hierarchical-cache",
}
# SGLang logs a `Decode batch ... cuda graph: X` line every `--decode-log-interval` decode steps
# (default 40), counted across requests.
DEFAULT_DECODE_LOG_INTERVAL = 40
_FALSE = frozenset({"false", "0", "no", "off"})
# SGLang options (without `--`) that carry what the supervisor sets itself, by what they set: the
# configuration refuses them in a profile's args (core/config), where they would fight the typed
# settings.
MANAGED_FLAGS: Mapping[str, str] = {
    "model-path": "model",
    "model": "model",
    "host": "host",
    "port": "port",
    "api-key": "api_key",
    "admin-api-key": "admin_api_key",
    "config": "config_file",
}


@dataclass(frozen=True)
class Flags:
    """A rendered SGLang argv as option → values (None for a bare switch); last occurrence wins.

    `order` is every option occurrence in argv order, so that aliases of one option (`--tp`,
    `--tp-size`) also obey "the last one wins"."""

    values: Mapping[str, tuple[str | None, ...]]
    order: tuple[tuple[str, str | None], ...] = ()

    def has(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str) -> str | None:
        vals = self.values.get(name)
        return vals[-1] if vals else None

    def last(self, names: Iterable[str]) -> str | None:
        """The value of the last occurrence of any of `names` (aliases of one option)."""
        wanted = set(names)
        for name, value in reversed(self.order):
            if name in wanted:
                return value
        return None

    def on(self, name: str) -> bool:
        """A switch that is set (`--x`, or `--x true` for bool-typed flags)."""
        if name not in self.values:
            return False
        val = self.get(name)
        return val is None or val.lower() not in _FALSE

    def int(self, name: str, default: int | None = None) -> int | None:
        return _as_int(self.get(name), default)

    def int_of(self, names: Iterable[str], default: builtins.int) -> builtins.int:
        """The integer value of the last of `names`; `default` when absent or not an integer."""
        value = _as_int(self.last(names), default)
        return default if value is None else value


def _as_int(raw: str | None, default: int | None) -> int | None:
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default


def parse_flags(argv: Sequence[str], catalog: FlagCatalog | None = None) -> Flags:
    """Group `--opt value...` tokens; with a catalogue, expand abbreviations as argparse would."""
    out: dict[str, list[str | None]] = {}
    order: list[list[str | None]] = []  # [name, value] per occurrence, values filled in below
    current: str | None = None
    for tok in argv:
        if tok.startswith("--"):
            name, eq, inline = tok.partition("=")
            if catalog is not None:
                name = catalog.resolve(name) or name
            name = ALIASES.get(name, name)
            out.setdefault(name, [])
            if eq:
                out[name].append(inline)
                order.append([name, inline])
                current = None
            else:
                current = name
                out[name].append(None)
                order.append([name, None])
        elif current is not None:
            vals = out[current]
            vals[-1] = tok if vals[-1] is None else f"{vals[-1]} {tok}"
            order[-1][1] = vals[-1]
    return Flags({k: tuple(v) for k, v in out.items()}, tuple((str(n), v) for n, v in order))


def options_set(argv: Sequence[str]) -> frozenset[str]:
    """The options a command line turns on (`--x`, `--x value`; not `--x false`)."""
    flags = parse_flags(argv)
    return frozenset(name for name in flags.values if flags.on(name))


def tp_size(argv: Sequence[str]) -> int:
    """GPUs per engine (tensor parallel size); 1 when absent or not a positive integer."""
    return tp_of(parse_flags(argv))


def tp_of(flags: Flags) -> int:
    """`tp_size` of a command already read."""
    return max(1, flags.int_of(TP_FLAGS, 1))


def decode_log_interval(argv: Sequence[str]) -> int:
    """Decode steps between the engine's `Decode batch` lines (the monitor sizes its decode-mode
    evidence probe by it); SGLang's default when absent or not a positive integer."""
    return max(1, parse_flags(argv).int_of(("--decode-log-interval",), DEFAULT_DECODE_LOG_INTERVAL))
