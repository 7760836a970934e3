"""`sglang-supervisor fidelity --config C [--reset]`: show the model's output-fidelity reference;
`--reset` re-takes it (starts the reference profile on the configured port, as `tune` starts a
trial, takes the sample, stores it, stops the engine).

Exit status: 0 shown (also "none yet") or re-taken, 69 the reference profile did not serve,
75 the engine port is busy (a running supervisor), 78 configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import httpx

from sglang_supervisor.commands.doctor import port_busy
from sglang_supervisor.commands.tune import load_prepared, tune_profile
from sglang_supervisor.core import fidelity as F
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.profiles import RenderedCommand
from sglang_supervisor.shell.checks.fidelity import (
    Reference,
    ReferenceStore,
    SampleUnavailable,
    dtype_of,
    key_for,
    take_sample,
)
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.supervisor import Prepared


def describe(ref: Reference | None, key: str, store: ReferenceStore,
             reference_profile: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "path": str(store.path(key)), "reference_profile": reference_profile,
                           "reference": None}
    if ref is not None:
        doc = ref.to_json()
        sample = doc.pop("sample")
        doc["prompts"] = [{"prompt": p["prompt"], "text": F.shown(p["text"]), "tokens": len(p["output_ids"])}
                          for p in sample["prompts"]]
        doc["reference_text_tokens"] = len(sample["ref_ids"])
        out["reference"] = doc
    return out


def _text(doc: dict[str, Any]) -> str:
    ref = doc["reference"]
    if ref is None:
        return (f"no fidelity reference for this model (key {doc['key']}); it is taken when "
                f"{doc['reference_profile']!r} reaches READY, or now with --reset")
    lines = [f"fidelity reference {doc['key']} ({doc['path']})",
             f"  taken {ref['taken_at_utc']} under {ref['profile']!r}, SGLang {ref['sglang_version']}, "
             f"command {ref['command_hash']}, dtype {ref['dtype']}",
             f"  accept length per speculative profile: {ref['accept'] or 'none measured'}"]
    lines += [f"  {p['prompt']!r} -> {p['text']!r}" for p in ref["prompts"]]
    return "\n".join(lines)


async def retake(prepared: Prepared, profile: str, key: str, store: ReferenceStore) -> Reference | str:
    """Start `profile`, take the sample, store it as the reference; the failure text otherwise."""
    config = prepared.config
    taken: list[Reference] = []

    async def take(name: str, rc: RenderedCommand, base_url: str,
                   accept: float | None) -> tuple[str, str] | None:
        async with httpx.AsyncClient() as client:
            try:
                got = await take_sample(client, base_url, prepared.api_key, config.fidelity.timeout_s)
            except SampleUnavailable as exc:
                return "probe_failed", f"fidelity sample: {exc.detail}"
        ref = Reference(key=key, sample=got, profile=name, version=prepared.version,
                        command_hash=state.command_hash(rc.argv, rc.env), model=config.engine.model_path,
                        dtype=dtype_of(rc.argv), taken_at=time.time(), accept={})
        store.save(ref)
        taken.append(ref)
        return None

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    result = await tune_profile(prepared, profile, 1, progress, take)
    if taken:
        return taken[0]
    return f"{profile}: {result.failure or 'no reference taken'}: {result.detail or ''}".strip()


def main(args: argparse.Namespace) -> int:
    prepared = load_prepared(args.config)
    if prepared is None:
        return ExitCode.CONFIG
    config = prepared.config
    profile = F.reference_profile(config.profile_names, config.fidelity.reference_profile)
    key = key_for(config.engine.model_path, prepared.renders[profile].argv)
    store = ReferenceStore(config.state_dir)
    retaken = False
    if args.reset:
        if port_busy(config.engine.host, config.engine.port):
            print(f"fidelity: port {config.engine.port} is in use (is the supervisor running? stop it "
                  "first: --reset starts the reference profile on the configured port)", file=sys.stderr)
            return ExitCode.TEMPORARY
        store.reset(key)
        got = asyncio.run(retake(prepared, profile, key, store))
        if isinstance(got, str):
            print(f"fidelity: no reference taken: {got}", file=sys.stderr)
            return ExitCode.ALL_PROFILES_FAILED
        retaken = True
    doc = describe(store.load(key), key, store, profile)
    doc["retaken"] = retaken
    print(json.dumps(doc, indent=2) if args.json else _text(doc))
    return ExitCode.OK
