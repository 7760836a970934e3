"""Command line: argument definitions and the exit-code contract.

Each subcommand's work lives in `sglang_supervisor.commands.<name>` and is imported lazily, so
`sglang-supervisor --help` and `check` stay fast and need neither NVML nor an engine.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from sglang_supervisor import __version__

DEFAULT_CONFIG = "/etc/sglang-supervisor/qwen.yaml"

EXIT_CODES_HELP = """exit codes:
  0   clean stop
  1   internal error of the supervisor (logged and counted; no profile is blamed)
  2   usage error
  69  every profile of the fallback ladder failed
  75  temporary: GPU held by a foreign process, port busy (systemd may retry)
  78  configuration error (systemd does not restart: RestartPreventExitStatus=78)
"""


def _add_config(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument(
        "--config",
        "-c",
        required=required,
        default=None if required else DEFAULT_CONFIG,
        metavar="FILE",
        help="supervisor configuration (YAML)" + ("" if required else f"; default {DEFAULT_CONFIG}"),
    )


def build_parser() -> argparse.ArgumentParser:
    """Long because: the whole argparse surface of every subcommand in one place, read top to bottom as
    --help prints it; each subcommand's options are a few add_argument calls that splitting would
    only scatter.
    """
    parser = argparse.ArgumentParser(
        prog="sglang-supervisor",
        description="Keeps a tuned SGLang server fast and alive: renders the command from a profile, "
        "gates readiness on CUDA graph capture, probes tokens/s, exports Prometheus metrics and "
        "falls back along a profile ladder when capture fails, the engine crashes or hangs, or "
        "throughput regresses.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("run", help="the daemon (what systemd starts, or a container's PID 1)",
                       epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_config(p)
    p.add_argument("--log-format", choices=["journald", "json", "console"], default=None,
                   help="supervisor log format (default: journald under systemd, console on a terminal, "
                        "JSON lines otherwise, e.g. in a container)")
    p.add_argument("--retry-known-bad", action="store_true",
                   help="ignore what this machine remembers for this start (known-bad profiles and "
                        "the last good one): climb the ladder from its first profile")

    p = sub.add_parser(
        "forget", help="clear one model's memory of failed profiles (and of the derived profiles "
        "that served): the next start tries them again",
        epilog="exit status: 0 done (or nothing to forget), 2 no such profile, 78 configuration "
        "error, 1 the state file cannot be written (run as root or the service user)")
    _add_config(p)
    p.add_argument("--profile", "-p", metavar="P",
                   help="forget only this profile's failures (default: every failure record and the "
                   "last good profile, so the next start climbs the ladder from the top)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "upgrade", help="check a candidate SGLang release (a second venv) against every profile, "
        "then let the running daemon put it on trial: promoted if it measures as well, else "
        "rolled back",
        epilog="exit status: 0 the candidate can run the tuned profile (and, with --now, the "
        "daemon was asked), 78 it cannot (the fix is printed) or a configuration error, 2 no "
        "candidate named, 1 the request cannot be written")
    _add_config(p)
    p.add_argument("--to", metavar="PYTHON",
                   help="the candidate venv's interpreter, e.g. /opt/sglang-NEW/bin/python "
                   "(default: engine.candidate.python)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="only print what changes per profile (the default)")
    mode.add_argument("--now", action="store_true",
                      help="then ask the running daemon to run the canary (SIGHUP)")
    mode.add_argument("--retry", action="store_true",
                      help="as --now, for a candidate that was rolled back and whose venv did "
                      "not change since")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("check", help="validate a configuration (exit 0 or 78)")
    _add_config(p)
    p.add_argument("--sglang-version", metavar="V",
                   help="check for this SGLang version instead of asking the engine (offline checks)")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.add_argument("--alone", action="store_true",
                   help="do not compare with the other configurations in the same directory (by default "
                        "a port, metrics address, log file, state file or GPU another model there also "
                        "claims is an error)")

    p = sub.add_parser(
        "place", help="copy a configuration for another model on this host, with its own engine port, "
        "metrics address and engine log file (what sglang-model add writes)",
        epilog="the new configuration goes to stdout, each value changed to stderr; exit 0, or 2 when "
        "--from cannot be read")
    p.add_argument("name", metavar="NAME", help="the new model's name (its top-level name:)")
    p.add_argument("--from", dest="from_file", required=True, metavar="FILE",
                   help="the configuration to start from")
    p.add_argument("--config-dir", default="/etc/sglang-supervisor", metavar="DIR",
                   help="where the host's other models are configured (default /etc/sglang-supervisor)")

    p = sub.add_parser(
        "status", help="every model on this host at a glance: unit, phase, profile, tok/s, time below "
        "the best profile, last failure, way back, gateway, GPUs, stale code",
        epilog="asks each running supervisor for its /status on metrics.address; exit 0, or 78 when "
        "--all finds no configuration")
    _add_config(p)
    p.add_argument("--all", action="store_true",
                   help="every configuration in --config-dir instead of --config")
    p.add_argument("--config-dir", default="/etc/sglang-supervisor", metavar="DIR",
                   help="where --all looks (default /etc/sglang-supervisor)")
    p.add_argument("--json", action="store_true", help="one object per model, stable field names")

    p = sub.add_parser("render", help="show the SGLang command(s) a configuration would start")
    _add_config(p)
    p.add_argument("--profile", "-p", help="render only this profile (default: every profile)")
    p.add_argument("--sglang-version", metavar="V",
                   help="render for this SGLang version (default: the configured engine version)")
    p.add_argument("--format", choices=["shell", "json"], default="shell")
    p.add_argument("--node-rank", type=int, metavar="R",
                   help="multi-node group: render node R's command (default: group.node_rank)")

    p = sub.add_parser("logscan", help="explain a saved SGLang log: ready? capture? why did it fail?")
    p.add_argument("files", nargs="+", metavar="FILE", help="engine log file(s); - for stdin")
    p.add_argument("--json", action="store_true", help="one JSON object per file")
    p.add_argument("--run", type=int, default=None, metavar="N",
                   help="a log file holding several engine starts: summarise run N (1 = the first; "
                   "-1 = the last, the default); the others are listed")
    p.add_argument("--explain", action="store_true",
                   help="also print the failure's line and what the supervisor would do about it: "
                   "the fallback profile the configuration's remediation rules pick")
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, metavar="FILE",
                   help="the configuration whose remediation rules --explain applies; "
                   f"default {DEFAULT_CONFIG}")

    p = sub.add_parser("demo", help="run the supervisor on the SGLang simulator, in the foreground",
                       epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="inject a simulator fault into the first profile's engine (repeatable; "
                   "see sglang-sim --help), e.g. capture-fail:prefill")
    p.add_argument("--engine-port", type=int, default=None, metavar="N",
                   help="simulated engine port (default: a free loopback port)")
    p.add_argument("--metrics-address", default=None, metavar="HOST:PORT",
                   help="metrics endpoint (default: 127.0.0.1:9400, or a free port if taken)")
    p.add_argument("--exit-after-ready", action="store_true",
                   help="stop cleanly once READY was sent (for scripts and tests)")
    p.add_argument("--json-summary", action="store_true",
                   help="print a JSON summary of the attempts as the last stdout line at exit")
    p.add_argument("--time-scale", type=float, default=None, metavar="X",
                   help="simulator time scale (default: $SGLANG_SIM_TIME_SCALE or 0.05)")

    p = sub.add_parser("probe", help="measure TTFT and decode tok/s of any SGLang server")
    p.add_argument("--url", required=True, help="engine base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--input-tokens", type=int, default=None, metavar="N",
                   help="approximate prompt length (default: the versioned probe shape)")
    p.add_argument("--concurrency", type=int, default=1, metavar="C")
    p.add_argument("--runs", type=int, default=3, metavar="R")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="per-request timeout")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="file holding the API key (or set SGLANG_API_KEY)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("doctor", help="audit host, engine and profiles: the performance left on the table",
                       epilog="for a configuration in /etc/sglang-supervisor it also checks what the unit "
                       "sees (interpreter, engine, model, directories under User=, ProtectHome=, "
                       "ProtectSystem=), and whether its running unit still runs code older than "
                       "the installed package (the unit's /status). exit status: 0 when no finding "
                       "is an error (warnings allowed), 1 otherwise")
    _add_config(p)
    p.add_argument("--url", help="also inspect this running server (/server_info; with --config, the "
                   "supervisor's /status: is it serving a fallback profile?)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("tune", help="start each profile, probe it, rank them (a profile that fails as run "
                       "would derive from is followed by that derived profile); run then starts the winner",
                       epilog="exit status: 0 a profile served (the winner is persisted), 69 none did, "
                       "75 the engine port is busy (stop the supervisor first), 78 configuration error")
    _add_config(p)
    p.add_argument("--profiles", metavar="P,...", help="comma-separated profile names (default: all)")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="probes per profile")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("fidelity", help="show the model's output-fidelity reference; --reset re-takes it",
                       epilog="the reference (greedy outputs of a fixed probe set and the log-probs of a "
                       "reference text) is what every start is judged against before READY. --reset "
                       "starts the reference profile (fidelity.reference_profile, default the last rung) "
                       "on the configured port, takes it, stops it. exit status: 0 shown or re-taken, "
                       "69 the reference profile did not serve, 75 the engine port is busy (stop the "
                       "supervisor first), 78 configuration error")
    _add_config(p)
    p.add_argument("--reset", action="store_true", help="forget the reference and take it again now")
    p.add_argument("--json", action="store_true")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(f"sglang_supervisor.commands.{args.command}")
    try:
        code: int = module.main(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `render ... | head`: the reader went away, which is not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
