"""`logscan FILE... [--json] [--run N] [--explain]`: why did my server not come up? The daemon's
parser, offline. The JSON object is a stable contract: docs/LOGSCAN.md."""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, TextIO

from sglang_supervisor.core.config import ConfigError
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.failover import choose_next
from sglang_supervisor.core.logruns import Run, scan_runs
from sglang_supervisor.core.logsummary import LogSummary, summarize
from sglang_supervisor.engine.sglang import REQUEST_RECORDS_ON_STDOUT
from sglang_supervisor.shell.files.configfile import load_config


def main(args: argparse.Namespace) -> int:
    status = ExitCode.OK
    for name in args.files:
        try:
            runs = _scan(name)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            print(f"logscan: cannot read {name}: {reason}", file=sys.stderr)
            status = ExitCode.FAILURE
            continue
        wanted = -1 if args.run is None else args.run
        index = wanted - 1 if wanted > 0 else len(runs) + wanted
        if not 0 <= index < len(runs):
            print(f"logscan: {name} holds {len(runs)} run(s); --run {wanted} is not one of them "
                  f"(1..{len(runs)}, or -1 for the last)", file=sys.stderr)
            status = ExitCode.FAILURE
            continue
        run = runs[index]
        summary = summarize(run.events)
        explain = _explain(summary, args.config) if args.explain else None
        if args.json:
            row = {"file": name, **summary.to_json(), "run": run.index,
                   "runs": [_run_row(r, summarize(r.events) if r is not run else summary) for r in runs],
                   "text_request_records": run.text_request_records}
            if explain is not None:
                row["explain"] = explain
            print(json.dumps(row))
        else:
            _report(name, summary, sys.stdout)
            _report_request_records(run, sys.stdout)
            _report_runs(runs, run, sys.stdout)
            if explain is not None:
                _report_explain(explain, sys.stdout)
    return int(status)


def _scan(name: str) -> list[Run]:
    if name == "-":
        return scan_runs(sys.stdin.buffer.read)
    # O_NONBLOCK: a FIFO without a writer would block open() forever; only regular files are
    # read by name (a stream comes in on stdin, where the user chose to wait for it)
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket?); pipe a "
                                        f"stream in instead: logscan - < {name}")
        return scan_runs(fh.read)


def _run_row(run: Run, s: LogSummary) -> dict[str, Any]:
    return {"run": run.index, "first_line": run.first_line, "last_line": run.last_line, "ready": s.ready,
            "phase": s.phase, "failure": None if s.failure is None else s.failure["class"]}


def _explain(s: LogSummary, config_path: str) -> dict[str, Any] | None:
    """The failure, and the profile the configuration's remediation rules start next."""
    if s.failure is None:
        return None
    cls = FailureClass(s.failure["class"])
    out: dict[str, Any] = {"class": cls.value, "line": s.failure["line"], "message": s.failure["message"],
                           "hint": s.fix, "config": config_path, "after_profile": None,
                           "next_profile": None, "rule": None, "next_description": None, "error": None}
    try:
        config = load_config(Path(config_path), on_warning=lambda p: None)
    except (ConfigError, OSError) as exc:
        out["error"] = f"cannot read {config_path}: {exc} (pass --config FILE)"
        return out
    order = tuple(p.name for p in config.profiles)
    # The log does not say which profile ran: assume the first (best) one, the usual first start.
    nxt, why = choose_next(cls, order[0], order, config.remediation, ())
    out.update(after_profile=order[0], next_profile=nxt, rule=why)
    if nxt is not None:
        out["next_description"] = " ".join(config.profile(nxt).description.split()) or None
    return out


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


def _report_request_records(run: Run, out: TextIO) -> None:
    """A saved log holds both of the engine's streams with nothing to tell them apart: after a
    text-form request record, a line may be an API user's (SGLang prints dict keys unescaped)."""
    if run.text_request_records:
        print(f"  note: {run.text_request_records} --log-requests record(s) in the text form: SGLang "
              "prints their dict keys unescaped, so an API user can write whole lines into this log; "
              "a failure, crash or ready line above may be theirs. The running supervisor is not "
              f"misled (it reads the engine's stdout, where SGLang {REQUEST_RECORDS_ON_STDOUT}+ writes "
              "these records, apart); see docs/FAULTS.md", file=out)


def _report_runs(runs: list[Run], shown: Run, out: TextIO) -> None:
    if len(runs) < 2:
        return
    print(f"  this is run {shown.index} of {len(runs)} in the file (lines {shown.first_line}-"
          f"{shown.last_line}); the others (logscan --run N shows one):", file=out)
    for r in runs:
        if r is shown:
            continue
        s = summarize(r.events)
        state = "READY" if s.ready else "NOT READY"
        failure = f", {s.failure['class']} at line {s.failure['line']}" if s.failure else ""
        print(f"    run {r.index}: lines {r.first_line}-{r.last_line}: {state}{failure}", file=out)


def _report_explain(e: dict[str, Any] | None, out: TextIO) -> None:
    if e is None:
        print("  explain: no failure in this run, nothing for the supervisor to fall back from", file=out)
        return
    print(f"  explain: {e['class']} at line {e['line']}: {e['message'][:300]}", file=out)
    if e["error"] is not None:
        print(f"    {e['error']}", file=out)
        return
    if e["next_profile"] is None:
        print(f"    the supervisor would not start another profile after '{e['after_profile']}' "
              f"({e['rule']}): it stops and the unit fails", file=out)
        return
    print(f"    the supervisor would start profile '{e['next_profile']}' next ({e['rule']}, "
          f"after '{e['after_profile']}' in {e['config']})", file=out)
    if e["next_description"]:
        print(f"    {e['next_description'][:400]}", file=out)


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
