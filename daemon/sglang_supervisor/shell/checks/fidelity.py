"""Output fidelity over HTTP and on disk: take a sample from the engine, keep one reference per
model + tokenizer + dtype in the state directory, judge a start against it (core/fidelity.py).

A sample that cannot be taken (a timeout, a refused connection, a malformed answer) raises
`SampleUnavailable`: the supervisor's own trouble, never an output mismatch.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sglang_supervisor.core import fidelity as F
from sglang_supervisor.engine.api import (
    GENERATE_ROUTE,
    greedy_payload,
    parse_generated,
    parse_input_logprobs,
    scoring_payload,
)
from sglang_supervisor.engine.argv import parse_flags
from sglang_supervisor.shell.checks.enginehttp import EngineAnswerError, Problem, fetch, parse_json

MAX_REFERENCE_BYTES = 1 << 20
# The files that say which model and tokenizer a directory holds (their content is hashed).
MODEL_ID_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
MAX_MODEL_FILE_BYTES = 64 << 20


class SampleUnavailable(Exception):
    """No sample: the engine did not answer in time, refused, or answered something malformed."""

    def __init__(self, problem: Problem, detail: str) -> None:
        self.problem = problem
        self.detail = detail
        super().__init__(f"{problem.value}: {detail}")

    @property
    def timed_out(self) -> bool:
        return self.problem is Problem.TIMEOUT


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, object],
                headers: Mapping[str, str], deadline_s: float) -> Any:
    try:
        answer = await fetch(client, url, method="POST", json_body=body, headers=headers,
                             deadline_s=deadline_s)
        if answer.status != 200:
            raise EngineAnswerError(Problem.HTTP_STATUS, f"HTTP {answer.status} from {url}", answer.status)
        return parse_json(answer.body, what=url)
    except EngineAnswerError as exc:
        raise SampleUnavailable(exc.problem, exc.detail) from None


async def take_sample(client: httpx.AsyncClient, base_url: str, api_key: str | None,
                      timeout_s: float, spec_accept_length: float | None = None) -> F.Sample:
    """The probe set's answers, one request after another, within `timeout_s` in all."""
    url = base_url.rstrip("/") + GENERATE_ROUTE
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise SampleUnavailable(Problem.TIMEOUT, f"the fidelity sample took over {timeout_s:g} s")
        return rest

    prompts: list[F.PromptSample] = []
    for prompt in F.PROMPTS:
        body = await _post(client, url, greedy_payload(prompt, F.PROMPT_TOKENS), headers, left())
        gen = parse_generated(body)
        if gen is None:
            raise SampleUnavailable(Problem.BAD_SHAPE, "a /generate answer without text and output_ids")
        prompts.append(F.PromptSample(prompt, gen.output_ids, gen.text))
    body = await _post(client, url, scoring_payload(F.REFERENCE_TEXT), headers, left())
    scored = parse_input_logprobs(body)
    if scored is None:
        raise SampleUnavailable(Problem.BAD_SHAPE,
                                "a /generate answer without meta_info.input_token_logprobs")
    return F.Sample(tuple(prompts), scored[0], scored[1], spec_accept_length)


# -- the stored reference ---------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    key: str
    sample: F.Sample
    profile: str
    version: str  # SGLang's
    command_hash: str
    model: str
    dtype: str
    taken_at: float
    accept: Mapping[str, float]  # profile -> accept length when it last passed (same weights)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "probe_set": F.PROBE_SET_VERSION, "profile": self.profile,
                "sglang_version": self.version, "command_hash": self.command_hash,
                "model": self.model, "dtype": self.dtype, "taken_at": self.taken_at,
                "taken_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.taken_at)),
                "accept": dict(self.accept), "sample": F.sample_to_json(self.sample)}


def model_files(model_path: str) -> dict[str, bytes]:
    """The model's identity files that exist (bounded reads); {} for a hub name."""
    out: dict[str, bytes] = {}
    for name in MODEL_ID_FILES:
        p = Path(model_path) / name
        with contextlib.suppress(OSError):
            if p.is_file() and p.stat().st_size <= MAX_MODEL_FILE_BYTES:
                out[name] = p.read_bytes()
    return out


def dtype_of(argv: Sequence[str]) -> str:
    return parse_flags(argv).get("--dtype") or "auto"


def key_for(model_path: str, argv: Sequence[str]) -> str:
    return F.reference_key(model_path, model_files(model_path), dtype_of(argv))


class ReferenceStore:
    """`<state_dir>/fidelity/<key>.json`, written atomically; anything unreadable is absent."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir) / "fidelity"

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def load(self, key: str) -> Reference | None:
        try:
            raw = self.path(key).read_bytes()[:MAX_REFERENCE_BYTES + 1]
        except OSError:
            return None
        if len(raw) > MAX_REFERENCE_BYTES:
            return None
        try:
            doc = parse_json(raw, what="fidelity reference")
            if not isinstance(doc, dict) or doc.get("probe_set") != F.PROBE_SET_VERSION:
                return None
            accept = doc.get("accept") or {}
            if not isinstance(accept, dict):
                return None
            return Reference(
                key=key, sample=F.sample_from_json(doc.get("sample")), profile=str(doc.get("profile")),
                version=str(doc.get("sglang_version")), command_hash=str(doc.get("command_hash")),
                model=str(doc.get("model")), dtype=str(doc.get("dtype")),
                taken_at=float(doc.get("taken_at") or 0.0),
                accept={str(k): float(v) for k, v in accept.items()
                        if isinstance(v, int | float) and not isinstance(v, bool)})
        except (EngineAnswerError, F.SampleFormatError, TypeError, ValueError):
            return None

    def save(self, ref: Reference) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path(ref.key).with_suffix(".tmp")
        tmp.write_text(json.dumps(ref.to_json(), indent=1))
        os.replace(tmp, self.path(ref.key))

    def reset(self, key: str) -> bool:
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def with_accept(self, ref: Reference, profile: str, accept: float) -> Reference:
        new = Reference(**{**ref.__dict__, "accept": {**ref.accept, profile: accept}})
        with contextlib.suppress(OSError):
            self.save(new)
        return new
