"""`logscan FILE... [--json]`: why did my server not come up? The daemon's parser, offline."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from sglang_supervisor.exitcodes import ExitCode
from sglang_supervisor.logwatch import LogSummary, parse_stream, summarize


def main(args: argparse.Namespace) -> int:
    status = ExitCode.OK
    for name in args.files:
        try:
            summary = _scan(name)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            print(f"logscan: cannot read {name}: {reason}", file=sys.stderr)
            status = ExitCode.FAILURE
            continue
        if args.json:
            print(json.dumps({"file": name, **summary.to_json()}))
        else:
            _report(name, summary, sys.stdout)
    return int(status)


def _scan(name: str) -> LogSummary:
    if name == "-":
        return summarize(parse_stream(sys.stdin.buffer.read))
    with open(name, "rb") as fh:
        return summarize(parse_stream(fh.read))


def _report(name: str, s: LogSummary, out: TextIO) -> None:
    state = "READY" if s.ready else "NOT READY"
    print(f"{name}: {state}, phase reached: {s.phase.replace('_', ' ')}", file=out)
    if s.tp_size is not None:
        print(f"  tensor parallel size: {s.tp_size}", file=out)
    print(f"  CUDA graph capture: {_capture_line(s.capture)}", file=out)
    for line in _capture_details(s.capture["events"]):
        print(f"    {line}", file=out)
    if s.failure is not None:
        print(f"  failure: {s.failure['class']} at line {s.failure['line']}", file=out)
        print(f"    {s.failure['message'][:300]}", file=out)
        if s.fix:
            print(f"  what to do: {s.fix}", file=out)
    elif not s.ready:
        print("  failure: none found in the log (cut short? still starting? a hang?)", file=out)
    if s.crashed:
        print("  crashed: yes (a child process died or the launcher killed itself)", file=out)
    if s.last_gen_throughput is not None:
        graph = {True: "on", False: "OFF (eager)", None: "unknown"}[s.decode_cuda_graph]
        print(f"  last decode throughput: {s.last_gen_throughput} tok/s, decode CUDA graph: {graph}",
              file=out)
    if s.last_input_throughput is not None:
        print(f"  last prefill throughput: {s.last_input_throughput} tok/s", file=out)


def _capture_line(capture: dict[str, Any]) -> str:
    if not capture["began"]:
        return "failed before any capture began" if capture["failed"] else "none began"
    if capture["failed"]:
        return "FAILED"
    return "completed" if capture["completed"] else "began, not completed"


def _capture_details(events: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    ended = {(e["kind"], e["rank"]): e for e in events if e["state"] == "end"}
    for e in events:
        if e["state"] != "begin":
            continue
        rank = f" [{e['rank']}]" if e["rank"] else ""
        end = ended.get((e["kind"], e["rank"]))
        if end is None:
            lines.append(f"{e['kind']}{rank}: began, never ended")
        elif end["elapsed_s"] is not None:
            lines.append(f"{e['kind']}{rank}: done in {end['elapsed_s']:.2f} s")
        else:
            lines.append(f"{e['kind']}{rank}: done")
    return lines
