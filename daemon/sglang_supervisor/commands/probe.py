"""`sglang-supervisor probe`: measure TTFT and decode tok/s of any SGLang server by hand."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.shell.checks.probe import DEFAULT_SHAPE, ProbeReport, make_shape, probe_many


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read --api-key-file {args.api_key_file}: {exc.strerror}") from None
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file} is empty")
        return key
    return os.environ.get("SGLANG_API_KEY") or None


def _fmt(value: float | None, unit: str, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f} {unit}"


def render_text(report: ProbeReport, url: str) -> str:
    d = report.to_dict()
    lines = [
        f"probe {url}  shape {report.shape.name}  concurrency {report.concurrency}  "
        f"runs {d['runs']}  ok {d['ok']}/{len(report.results)}",
        f"  decode (per stream, median)  {_fmt(d['median_decode_tps'], 'tok/s')}",
        f"  TTFT (median)                {_fmt(d['median_ttft_s'], 'ms', 1000)}",
        f"  ITL p50 / p90 (median)       {_fmt(d['median_itl_p50_s'], 'ms', 1000, 2)} / "
        f"{_fmt(d['median_itl_p90_s'], 'ms', 1000, 2)}",
        f"  end to end (median)          {_fmt(d['median_e2e_s'], 's', 1, 3)}",
    ]
    if report.concurrency > 1:
        lines.append(f"  aggregate (median of runs)   {_fmt(d['median_aggregate_tps'], 'tok/s')}")
    if d["spec_accept_length"] is not None:
        lines.append(f"  speculative accept length    {d['spec_accept_length']:.2f}")
    lines.extend(f"  error: {e}" for e in d["errors"])
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        key = _api_key(args)
        input_tokens = args.input_tokens if args.input_tokens is not None else DEFAULT_SHAPE.input_tokens
        shape = make_shape(input_tokens, args.max_new_tokens)
        if args.runs < 1 or args.concurrency < 1 or args.timeout <= 0:
            raise ValueError("--runs and --concurrency must be >= 1 and --timeout > 0")
        if not args.url.startswith(("http://", "https://")):
            raise ValueError(f"--url {args.url!r} must start with http:// or https://")
    except ValueError as exc:
        print(f"sglang-supervisor probe: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    report = asyncio.run(probe_many(args.url, shape, args.runs, args.concurrency, api_key=key,
                                    timeout=args.timeout))
    if args.json:
        print(json.dumps({"url": args.url, **report.to_dict()}, indent=2))
    else:
        print(render_text(report, args.url))
    # Nothing measured: the server is unreachable or broken (EX_UNAVAILABLE, like an exhausted ladder).
    return int(ExitCode.OK) if report.ok else int(ExitCode.ALL_PROFILES_FAILED)
