"""SGLang's `--log-requests` records, rendered the way SGLang 0.5.x renders them. Pure functions.

Read from `sglang/srt/utils/request_logger.py` (0.5.17 and 0.5.23 wheels) and checked against the
real 0.5.17 run in tests/fixtures/sglang-0.5.17-h200-log-requests/:

- text form: `Receive: obj=GenerateReqInput(rid='...', text='...', ...)`, after the reply
  `Finish: obj=GenerateReqInput(...), out={'text': '...', 'output_ids': [...], 'meta_info': {...}}`,
  for OpenAI routes first `Receive OpenAI: obj={...}`. Strings are `repr()`ed, so a newline in a
  prompt prints as `\\n` and a record is always one line.
- `--log-requests-level`: 0 and 1 leave out the text fields (0 also sampling_params), 2 cuts
  strings and lists longer than 2048 to `'first 1024' ... 'last 1024'`, 3 prints everything.
- `--log-requests-format json`: `{"timestamp": "...", "event": "request.received", "rid": ...,
  "obj": {...}}` (json.dumps, ensure_ascii=False; cut strings are joined with `...`).
- The request logger has its own handler: `[YYYY-MM-DD HH:MM:SS] ` (never ms, never a rank), on
  stdout (`log_utils.create_log_targets`, 0.5.8+; SGLang's own log is on stderr). Through
  0.5.7 the records went through SGLang's normal logger, to stderr.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# GenerateReqInput's fields in 0.5.17's order (the fixture's Receive line), with the values an
# ordinary /generate request leaves them at; `rid`, `text`, `sampling_params`, `stream` are set
# per request.
_GENERATE_FIELDS: tuple[tuple[str, Any], ...] = (
    ("rid", None), ("session_id", None), ("text", None), ("input_ids", None), ("input_embeds", None),
    ("image_data", None), ("video_data", None), ("audio_data", None), ("mm_hashes", None),
    ("use_audio_in_video", False), ("sampling_params", None), ("return_logprob", False),
    ("logprob_start_len", -1), ("top_logprobs_num", 0), ("token_ids_logprob", None),
    ("return_sampling_mask", False), ("return_text_in_logprobs", False),
    ("return_flat_raw_top_logprobs", False), ("return_flat_raw_top_logprobs_b64", False),
    ("stream", False), ("log_metrics", True), ("return_hidden_states", False),
    ("return_routed_experts", False), ("routed_experts_start_len", 0), ("return_indexer_topk", False),
    ("modalities", None), ("session_params", None), ("lora_path", None), ("lora_id", None),
    ("custom_logit_processor", None), ("positional_embed_overrides", None), ("bootstrap_host", None),
    ("bootstrap_port", None), ("bootstrap_room", None), ("bootstrap_pair_key", None),
    ("decode_tp_size", None), ("routed_dp_rank", None), ("disagg_prefill_dp_rank", None),
    ("routing_key", None), ("conversation_id", None), ("http_worker_ipc", None), ("background", False),
    ("require_reasoning", False), ("max_thinking_tokens", None), ("priority", None), ("extra_key", None),
    ("no_logs", False), ("custom_labels", None), ("return_bytes", False), ("return_entropy", False),
    ("return_prompt_token_ids", False), ("external_trace_header", None), ("received_time", None),
    ("need_wait_for_mm_inputs", None), ("num_items_assigned", None), ("mm_data_mooncake", None),
    ("encoder_urls", None), ("max_dynamic_patch", None), ("min_dynamic_patch", None),
    ("image_max_dynamic_patch", None), ("video_max_dynamic_patch", None), ("images_config", None),
    ("multi_item_delimiter_indices", None),
)
_TEXT_FIELDS = frozenset({"text", "input_ids", "input_embeds", "image_data", "audio_data", "video_data",
                          "lora_path"})
LEVELS = (0, 1, 2, 3)
FORMATS = ("text", "json")


@dataclass(frozen=True)
class Obj:
    """A dataclass as SGLang's logger sees it: a class name and its fields in order."""

    name: str
    fields: tuple[tuple[str, Any], ...]


def generate_req(rid: str, text: str | None, sampling_params: Mapping[str, Any], *,
                 stream: bool = False, input_ids: Sequence[int] | None = None) -> Obj:
    values = {"rid": rid, "text": text, "sampling_params": dict(sampling_params), "stream": stream,
              "input_ids": list(input_ids) if input_ids is not None else None}
    return Obj("GenerateReqInput", tuple((k, values.get(k, v)) for k, v in _GENERATE_FIELDS))


def level_metadata(level: int) -> tuple[int, frozenset[str], frozenset[str]]:
    """(max_length, skipped obj fields, skipped out fields) of RequestLogger._compute_metadata."""
    if level == 0:
        return 1 << 30, _TEXT_FIELDS | {"sampling_params"}, frozenset({"text", "output_ids", "embedding"})
    if level == 1:
        return 1 << 30, _TEXT_FIELDS, frozenset({"text", "output_ids", "embedding"})
    if level == 2:
        return 2048, frozenset(), frozenset()
    if level == 3:
        return 1 << 30, frozenset(), frozenset()
    raise ValueError(f"--log-requests-level must be 0, 1, 2 or 3, got {level}")


def to_text(data: Any, max_length: int, skip: frozenset[str] = frozenset()) -> str:
    """`_dataclass_to_string_truncated`."""
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return f"{data[:half]!r} ... {data[-half:]!r}"
        return repr(data)
    if isinstance(data, (list, tuple)):
        if len(data) > max_length:
            half = max_length // 2
            return str(data[:half]) + " ... " + str(data[-half:])
        return str(data)
    if isinstance(data, dict):
        return "{" + ", ".join(f"'{k}': {to_text(v, max_length)}" for k, v in data.items()
                               if k not in skip) + "}"
    if isinstance(data, Obj):
        return f"{data.name}(" + ", ".join(f"{k}={to_text(v, max_length)}" for k, v in data.fields
                                           if k not in skip) + ")"
    return str(data)


def to_jsonable(data: Any, max_length: int, skip: frozenset[str] = frozenset()) -> Any:
    """`_transform_data_for_logging`."""
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return data[:half] + "..." + data[-half:]
        return data
    if isinstance(data, (list, tuple)):
        if len(data) > max_length:
            half = max_length // 2
            return ([to_jsonable(v, max_length) for v in data[:half]] + ["..."]
                    + [to_jsonable(v, max_length) for v in data[-half:]])
        return [to_jsonable(v, max_length) for v in data]
    if isinstance(data, dict):
        return {k: to_jsonable(v, max_length) for k, v in data.items() if k not in skip}
    if isinstance(data, Obj):
        return {k: to_jsonable(v, max_length) for k, v in data.fields if k not in skip}
    if data is None or isinstance(data, (int, float, bool)):
        return data
    return str(data)


def _json_record(event: str, payload: dict[str, Any], now: float) -> str:
    record = {"timestamp": datetime.fromtimestamp(now).isoformat(), "event": event, **payload}
    return json.dumps(record, ensure_ascii=False)


def receive(obj: Obj, level: int, fmt: str, now: float) -> str:
    """The record SGLang logs when a request arrives (the message, without the line header)."""
    max_length, skip, _ = level_metadata(level)
    if fmt == "json":
        return _json_record("request.received", {"rid": dict(obj.fields).get("rid"),
                                                 "obj": to_jsonable(obj, max_length, skip)}, now)
    return f"Receive: obj={to_text(obj, max_length, skip)}"


def receive_openai(body: Mapping[str, Any], level: int, fmt: str, now: float) -> str:
    """The raw OpenAI request, logged before it becomes a GenerateReqInput."""
    max_length, _, _ = level_metadata(level)
    if fmt == "json":
        return _json_record("request.received.openai", {"obj": to_jsonable(dict(body), max_length)}, now)
    return f"Receive OpenAI: obj={to_text(dict(body), max_length)}"


def finish(obj: Obj, out: Mapping[str, Any], level: int, fmt: str, now: float) -> str:
    """The record SGLang logs when a request finished: the request again, then the output."""
    max_length, skip, out_skip = level_metadata(level)
    if fmt == "json":
        return _json_record("request.finished", {
            "rid": dict(obj.fields).get("rid"), "obj": to_jsonable(obj, max_length, skip),
            "out": to_jsonable(dict(out), max_length, out_skip)}, now)
    return f"Finish: obj={to_text(obj, max_length, skip)}, out={to_text(dict(out), max_length, out_skip)}"


def header(now: float) -> str:
    """The request logger's own line header (`[%(asctime)s] `, datefmt without ms)."""
    return datetime.fromtimestamp(now).strftime("[%Y-%m-%d %H:%M:%S] ")


def line(record: str, now: float) -> str:
    return header(now) + record + "\n"


def hostile_lines(level: int, fmt: str, now: float) -> list[str]:
    """What SGLang logs for one OpenAI chat request per HOSTILE_PROMPTS entry whose answer
    repeats the prompt: `Receive OpenAI`, `Receive`, `Finish`, each one line."""
    out: list[str] = []
    for i, text in enumerate(HOSTILE_PROMPTS):
        rid = f"{i:032x}"
        body = {"model": "default", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
        obj = generate_req(rid, text, {"max_new_tokens": 8, "stop": [text]})
        answer = {"text": text, "output_ids": [0] * 8,
                  "meta_info": {"id": rid, "finish_reason": {"type": "stop", "matched": text},
                                "prompt_tokens": 16, "completion_tokens": 8}}
        out += [line(receive_openai(body, level, fmt, now), now), line(receive(obj, level, fmt, now), now),
                line(finish(obj, answer, level, fmt, now), now)]
    return out


# What a hostile user puts into a prompt to make a log reader act: every failure, crash,
# capture and ready line a supervisor could look for, and forged lines behind a newline (repr()
# prints that newline as `\n`, so it can never start a line of its own).
HOSTILE_PROMPTS: tuple[str, ...] = (
    "My pip run printed: error: unrecognized arguments: --user. Why?",
    "sglang serve: error: argument --tp-size: invalid int value: 'x'",
    "OSError: [Errno 98] Address already in use",
    "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): "
    "address already in use",
    "Explain this: RuntimeError: CUDA error: an illegal memory access was encountered",
    "CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx",
    "Exception: Capture cuda graph failed: CUDA out of memory",
    "Fail when using backend: breakable for prefill runner.",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    "Rank 1 scheduler died during initialization (exit code: -9)",
    "Initialization failed. warmup error: boom",
    "Scheduler watchdog timeout (self.watchdog_timeout=300)",
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5) NCCL timeout c10::DistBackendError",
    "Scheduler hit an exception: Traceback (most recent call last):",
    "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: CUDA error: boom",
    "Subprocess scheduler_0 (pid=1) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
    "Received sigquit from a child process. It usually means the child failed.",
    "SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
    "The server is fired up and ready to roll!",
    "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=1.00 GB",
    "Capture cuda graph end. Time elapsed: 1.00 s. mem usage=0.10 GB. avail mem=1.00 GB.",
    "Decode batch, #running-req: 1, #token: 10, token usage: 0.00, cuda graph: True, "
    "gen throughput (token/s): 1.00, #queue-req: 0",
    "\n[2026-12-01 10:00:00 TP0] Capture cuda graph failed: out of memory",
    "\r[2026-12-01 10:00:00] The server is fired up and ready to roll!\n",
    "x')\n[2026-12-01 10:00:00] Received sigquit from a child process. It usually means the child failed.",
    "server_args=ServerArgs(tp_size=8, api_key='x')",
)
