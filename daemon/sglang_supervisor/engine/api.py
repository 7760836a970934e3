"""SGLang's HTTP API as the supervisor uses it: routes, Prometheus metric names, and the pure
parsers of the answers (`/metrics`, `/get_load`). Nothing else spells a route or an `sglang:` name.

Engine answers are untrusted: counts are bounded (`MAX_COUNT`), non-finite samples are absent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Routes (SGLang.md "HTTP API"; source notes §5).
GENERATE_ROUTE = "/generate"  # native streaming generation: what the throughput probe measures
HEALTH_ROUTE = "/health"  # a 1-token generation (about 1 s, 20 s timeout) on every known version
METRICS_ROUTE = "/metrics"  # Prometheus text, only with --enable-metrics
GET_LOAD_ROUTE = "/get_load"  # running and waiting requests per DP rank
MODEL_INFO_ROUTE = "/model_info"
SERVER_INFO_ROUTES = ("/server_info", "/get_server_info")  # resolved server args, preferred first
# Fields of /server_info that hold secrets (redacted before anything shows them).
SERVER_INFO_SECRET_KEYS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password"})

# Metric names (`sglang:` prefix; TP0 unless --enable-metrics-for-all-schedulers).
CUDA_GRAPH_PASSES = "sglang:cuda_graph_passes_total"  # label mode, see below
DECODE_GRAPH_MODE = "decode_cuda_graph"
DECODE_EAGER_MODE = "decode_none"  # decode steps that ran without a CUDA graph
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
NUM_RUNNING_REQS = "sglang:num_running_reqs"
NUM_QUEUE_REQS = "sglang:num_queue_reqs"
GENERATION_TOKENS_TOTAL = "sglang:generation_tokens_total"

# The samples parse_engine_metrics reads. SGLang's `/metrics` is mostly histograms (the real 0.5.17
# answer in tests/fixtures: 593 lines), and prometheus-client's parser took ~40 ms for all of it on
# the event loop at every health check; these lines alone take a fraction of that.
_READ_SAMPLES = re.compile(
    "^(?:" + "|".join(re.escape(n) for n in (CUDA_GRAPH_PASSES, SPEC_ACCEPT_LENGTH, NUM_RUNNING_REQS,
                                              NUM_QUEUE_REQS, GENERATION_TOKENS_TOTAL)) + r")[{ \t].*$",
    re.MULTILINE)

# Token counts beyond this are not counts (an engine answer is untrusted): ignored, so that the
# arithmetic on them stays finite.
MAX_COUNT = 1 << 40


def count_or_none(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_COUNT:
        return value
    return None


def finite_or_none(value: object) -> float | None:
    """A JSON number that is one (not a bool, not inf/nan), as float; else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int
    queued: int
    source: str  # "metrics" or "get_load"

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.queued == 0


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """The few engine `/metrics` samples the monitor needs, summed over ranks and labels."""

    running: int | None
    queued: int | None
    generation_tokens_total: float | None
    decode_graph_passes: float | None
    decode_eager_passes: float | None  # `decode_none`: decode steps that ran without a CUDA graph
    spec_accept_length: float | None


def parse_engine_metrics(text: str) -> EngineMetrics:
    """Pure: Prometheus text of SGLang's `/metrics` → `EngineMetrics`. Raises ValueError on garbage
    (in the samples read, or in the whole answer when it has none of them). Non-finite samples
    (legal in Prometheus text: NaN, +Inf) count as absent."""
    sums: dict[str, float] = {}
    spec: float | None = None
    read = _READ_SAMPLES.findall(text)
    # without a comment line, every sample is its own untyped family: names stay as written
    for family in text_string_to_metric_families("\n".join(read) + "\n" if read else text):
        for sample in family.samples:
            name = sample.name
            if not math.isfinite(sample.value):
                continue
            if name == CUDA_GRAPH_PASSES:
                mode = sample.labels.get("mode", "")
                name = f"{name}:{mode}"
            if name == SPEC_ACCEPT_LENGTH:
                spec = max(spec or 0.0, sample.value)
                continue
            sums[name] = sums.get(name, 0.0) + sample.value

    def value(key: str) -> float | None:
        v = sums.get(key)
        return v if v is not None and math.isfinite(v) else None  # a sum of huge values overflows

    def as_int(key: str) -> int | None:
        v = value(key)
        return int(v) if v is not None and 0 <= v <= MAX_COUNT else None

    return EngineMetrics(
        running=as_int(NUM_RUNNING_REQS),
        queued=as_int(NUM_QUEUE_REQS),
        generation_tokens_total=value(GENERATION_TOKENS_TOTAL),
        decode_graph_passes=value(f"{CUDA_GRAPH_PASSES}:{DECODE_GRAPH_MODE}"),
        decode_eager_passes=value(f"{CUDA_GRAPH_PASSES}:{DECODE_EAGER_MODE}"),
        spec_accept_length=spec,
    )


def parse_get_load(body: object) -> EngineLoad | None:
    """Pure: SGLang's `/get_load` answer (a list with one entry per DP rank, or one object).

    `num_reqs` counts running and waiting requests; `num_waiting_reqs` the waiting ones."""
    entries = body if isinstance(body, list) else [body]
    running = queued = 0
    seen = False
    for entry in entries:
        if not isinstance(entry, Mapping):
            return None
        total = count_or_none(entry.get("num_reqs"))
        waiting = count_or_none(entry.get("num_waiting_reqs"))
        if total is None:
            continue
        seen = True
        queued += waiting or 0
        running += max(total - (waiting or 0), 0)
    return EngineLoad(running, queued, "get_load") if seen else None




# -- output fidelity (core/fidelity.py): greedy prompts and one teacher-forced text --------------
# Checked in the 0.5.17 and 0.5.23 wheels (srt/managers/io_struct.py GenerateReqInput,
# tokenizer_manager.add_logprob_to_meta_info): `return_logprob` with `logprob_start_len: 0` puts
# `meta_info.input_token_logprobs` = [[logprob, token_id, text|null], ...] for every prompt token
# (the first one's logprob is null); a non-streaming answer carries `output_ids` and `text`.


def greedy_payload(prompt: str, max_new_tokens: int) -> dict[str, object]:
    """One non-streaming greedy generation of exactly `max_new_tokens` tokens."""
    return {"text": prompt, "stream": False,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                "ignore_eos": True}}


def scoring_payload(text: str) -> dict[str, object]:
    """The log-probability of every token of `text` given the ones before (teacher-forced)."""
    return {"text": text, "stream": False, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


MAX_IDS = 4096


@dataclass(frozen=True, slots=True)
class Generated:
    text: str
    output_ids: tuple[int, ...]
    spec_accept_length: float | None


def parse_generated(body: object) -> Generated | None:
    """Pure: a non-streaming `/generate` answer; None when it has not the documented shape."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, Mapping):
        return None
    text, ids = body.get("text"), body.get("output_ids")
    if not isinstance(text, str) or not isinstance(ids, list) or len(ids) > MAX_IDS:
        return None
    out = [count_or_none(i) for i in ids]
    if any(i is None for i in out):
        return None
    meta = body.get("meta_info")
    spec = finite_or_none(meta.get("spec_accept_length")) if isinstance(meta, Mapping) else None
    return Generated(text, tuple(i for i in out if i is not None), spec)


def parse_input_logprobs(body: object) -> tuple[tuple[int, ...], tuple[float | None, ...]] | None:
    """Pure: (token ids, logprobs) of `meta_info.input_token_logprobs`; None when malformed."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    meta = body.get("meta_info") if isinstance(body, Mapping) else None
    rows = meta.get("input_token_logprobs") if isinstance(meta, Mapping) else None
    if not isinstance(rows, list) or not rows or len(rows) > MAX_IDS:
        return None
    ids: list[int] = []
    lps: list[float | None] = []
    for row in rows:
        if not isinstance(row, list | tuple) or len(row) < 2:
            return None
        lp, tid = row[0], count_or_none(row[1])
        if tid is None:
            return None
        value = finite_or_none(lp)
        if value is None and lp is not None:
            return None
        lps.append(value)
        ids.append(tid)
    return tuple(ids), tuple(lps)
