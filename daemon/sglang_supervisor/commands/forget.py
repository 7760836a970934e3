"""`sglang-supervisor forget`: clear one model's memory of failed profiles (issue 18 item 2).

The supervisor skips a profile that failed for a while (`restart.known_bad_ttl_s`, doubling per
failure in a row) and starts the last good one instead. After the operator fixed the cause (a
driver update, more memory), `forget --profile P` makes the next start try P again; without
`--profile` every failure record and the last good profile of this model are forgotten, so the
next start climbs the ladder from the top. Only this model's state file (`state_dir/NAME.state.json`)
is touched; throughput baselines stay. A running supervisor picks it up at its next start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from sglang_supervisor.commands.loadconfig import load_or_report
from sglang_supervisor.core.config import did_you_mean
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.shell.files.state import STATE_FILE, StateStore, state_file_name


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def main(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None:
        return int(ExitCode.CONFIG)
    directory = Path(config.state_dir)
    if not (directory / state_file_name(config.name)).exists() and not (directory / STATE_FILE).exists():
        # Nothing was ever remembered; do not create the service's directory as root either.
        print(f"{config.name}: nothing remembered in {directory / state_file_name(config.name)}")
        return int(ExitCode.OK)
    store = StateStore(directory, config.name)
    before = store.snapshot()
    remembered = {p for fs in before.fingerprints.values() for p in fs.bad}
    profile: str | None = args.profile
    if profile is not None and profile not in config.profile_names and profile not in remembered:
        guess = did_you_mean(profile, config.profile_names)
        hint = f"did you mean {guess!r}?" if guess else f"profiles: {', '.join(config.profile_names)}"
        print(f"error: {config.name} has no profile {profile!r} ({hint})", file=sys.stderr)
        return int(ExitCode.USAGE)
    records = [(p, r) for fs in before.fingerprints.values() for p, r in fs.bad.items()
               if profile is None or p == profile]
    try:
        dropped = store.forget(profile)
    except OSError as exc:
        print(f"error: cannot write {store.path}: {exc}\n  run as root or as the service user "
              f"(sudo -u sglang ...)", file=sys.stderr)
        return int(ExitCode.FAILURE)
    if args.json:
        print(json.dumps({"config": args.config, "name": config.name, "state_file": str(store.path),
                          "profile": profile, "forgotten": dropped,
                          "records": [{"profile": p, "failure_class": r.failure_class,
                                       "failures": r.count, "last_failure": r.at}
                                      for p, r in records]}))
        return int(ExitCode.OK)
    what = f"profile {profile}" if profile else "every profile (and the last good one)"
    if dropped == 0:
        print(f"{config.name}: nothing remembered against {what} in {store.path}")
        return int(ExitCode.OK)
    print(f"{config.name}: forgot {what} in {store.path}:")
    for p, r in records:
        print(f"  {p}: {r.failure_class}, {r.count} failure(s) in a row, last {_when(r.at)}")
    print(f"The next start tries it first: systemctl restart sglang-{config.name}")
    return int(ExitCode.OK)
