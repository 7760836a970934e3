"""The supervisor's bridge from lifecycle actions to metrics, monitors and state, without an engine.

A Supervisor is built over demo.yaml rendered for 0.5.23 with its own state directory; launches
are recorded instead of spawned, so each test drives the real lifecycle with hand-fed inputs.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from sglang_supervisor.core.actions import Launch, MarkGood
from sglang_supervisor.core.config import ConfigProblem, parse_config
from sglang_supervisor.core.events import ServerReady
from sglang_supervisor.core.inputs import EngineExited, Launched, ProbeOk, Start, StopRequested
from sglang_supervisor.core.phases import Phase
from sglang_supervisor.engine.argv import DEFAULT_DECODE_LOG_INTERVAL
from sglang_supervisor.shell import reloadcheck, reloader
from sglang_supervisor.shell.engineproc.process import StopResult
from sglang_supervisor.shell.engineproc.runner import Engine
from sglang_supervisor.shell.files.configfile import default_demo_config_path
from sglang_supervisor.shell.supervisor import (
    Options,
    Supervisor,
    decode_log_interval,
    prepare,
)

VERSION = "0.5.23"


def demo_data(tmp_path: Path) -> dict[str, Any]:
    data = copy.deepcopy(yaml.safe_load(default_demo_config_path().read_text()))
    data["state_dir"] = str(tmp_path / "state")
    data["runtime_dir"] = str(tmp_path / "run")
    data["engine"]["log_file"] = str(tmp_path / "engine.log")
    data["metrics"] = {"enabled": False}
    return data


def make_supervisor(tmp_path: Path, data: dict[str, Any] | None = None) -> Supervisor:
    config = parse_config(yaml.safe_dump(data or demo_data(tmp_path)))
    return Supervisor(prepare(config, VERSION), Options(environ={}))


def restart_counts(sup: Supervisor) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(sup.metrics.exposition().decode()):
        for s in fam.samples:
            if s.name == "sglang_supervisor_restarts_total" and s.value:
                out[s.labels["reason"]] = s.value
    return out


def record_launches(sup: Supervisor) -> list[Launch]:
    launches: list[Launch] = []

    async def launch(a: Launch) -> None:
        launches.append(a)

    sup.runner.launch = launch  # type: ignore[method-assign]
    return launches


def test_restarts_are_counted_per_relaunch_not_per_failure(tmp_path: Path) -> None:
    sup = make_supervisor(tmp_path)
    launches = record_launches(sup)
    profiles = len(sup.config.profile_names)

    async def drive() -> None:
        sup._loop = asyncio.get_running_loop()  # what run() sets up: timers live on it
        sup.feed(Start())
        for _ in range(profiles):
            await asyncio.sleep(0)
            attempt = sup.lifecycle.attempt
            sup.feed(Launched(attempt, 1000 + attempt, frozenset()))
            sup.feed(EngineExited(attempt, -9, we_stopped=False))
        await asyncio.sleep(0)

    asyncio.run(drive())
    # Every profile failed: one start, then one restart per fallback; the last failure ends the
    # run (exit 69) without a restart, although it marks its profile bad like the others.
    assert len(launches) == profiles
    assert restart_counts(sup) == {"other": profiles - 1}


def test_monitor_uses_the_profiles_decode_log_interval(tmp_path: Path) -> None:
    data = demo_data(tmp_path)
    data["profiles"][1]["args"]["decode-log-interval"] = 7
    sup = make_supervisor(tmp_path, data)
    assert sup.serving.new_monitor("no-prefill-graph")._decode_log_interval == 7
    assert sup.serving.new_monitor("tuned")._decode_log_interval == DEFAULT_DECODE_LOG_INTERVAL
    assert decode_log_interval(["--decode-log-interval=3"]) == 3
    assert decode_log_interval(["--decode-log-interval", "x"]) == DEFAULT_DECODE_LOG_INTERVAL


def test_a_reload_that_changes_the_commands_changes_the_fingerprint(tmp_path: Path) -> None:
    data = demo_data(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    config = parse_config(path.read_text())
    sup = Supervisor(prepare(config, VERSION), Options(config_path=str(path), environ={}))
    launches = record_launches(sup)
    old_fp = sup.fp
    # The last good profile of the old commands must not pick the start under the new ones.
    sup.store.mark_good(old_fp, "low-mem", 1.0)
    data["profiles"][0]["args"]["mem-fraction-static"] = 0.85
    path.write_text(yaml.safe_dump(data))

    async def reload() -> None:
        sup._loop = asyncio.get_running_loop()
        await sup.reloader.reload()
        await asyncio.sleep(0)

    asyncio.run(reload())
    assert sup.fp != old_fp and sup.status()["fingerprint"] == sup.fp
    assert sup.fp == Supervisor(prepare(parse_config(path.read_text()), VERSION),
                                Options(environ={})).fp
    assert sup.lifecycle.settings.last_good is None
    assert [a.profile for a in launches] == ["tuned"]


class FakeProc:
    """The part of EngineProcess that a stop uses; it exits at once."""

    pid = 4242
    returncode = None
    we_stopped = False

    def group_members(self) -> list[Any]:
        return []

    async def stop(self, drain_s: float, kill_s: float) -> StopResult:
        return StopResult(returncode=0, terminated=True, drained=True, killed=False, seconds=0.0)


def test_stopping_the_engine_first_quiets_its_probes_and_health_checks(tmp_path: Path) -> None:
    sup = make_supervisor(tmp_path)

    async def scenario() -> None:
        sup._loop = asyncio.get_running_loop()
        sup.serving.monitor = sup.serving.new_monitor("tuned")
        sup.serving.ready_monitor = sup.serving.new_monitor("tuned")
        sup.serving.health_task = health = asyncio.ensure_future(asyncio.sleep(3600))
        eng = Engine(1, "tuned", FakeProc(), pump=None, eof=asyncio.Event(),  # type: ignore[arg-type]
                     secret_path=None)
        sup.runner.engine = eng
        sup.runner.stop("wedged")
        assert sup.serving.monitor.stopped and sup.serving.ready_monitor.stopped
        assert eng.proc.we_stopped
        assert eng.stopping is not None
        await eng.stopping
        assert health.cancelled() and sup.serving.health_task is None

    asyncio.run(scenario())


def test_a_ready_engine_exports_how_long_its_start_took(tmp_path: Path) -> None:
    sup = make_supervisor(tmp_path)
    sup._apply(MarkGood("low-mem", 144.8))
    assert sup.metrics.startup._value.get() == 144.8
    assert sup.metrics.fallback_level._value.get() == sup.config.profile_names.index("low-mem")
    assert sup.store.last_good(sup.fp) == "low-mem"


def test_a_reload_that_keeps_the_engine_keeps_it_good_under_the_new_fingerprint(tmp_path: Path) -> None:
    data = demo_data(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    sup = Supervisor(prepare(parse_config(path.read_text()), VERSION),
                     Options(config_path=str(path), environ={}))
    record_launches(sup)

    async def idle(*_args: Any) -> None:
        return None

    sup.serving.ready_probe = idle  # type: ignore[method-assign]
    sup.serving.health_loop = idle  # type: ignore[method-assign]
    old_fp = sup.fp

    async def serve_then_reload() -> None:
        sup._loop = asyncio.get_running_loop()
        sup.feed(Start())
        sup.feed(Launched(1, 1001, frozenset()))
        sup.feed(ServerReady(5, None))
        sup.feed(ProbeOk(50.0))
        assert sup.lifecycle.phase == Phase.SERVING and sup.store.last_good(old_fp) == "tuned"
        data["profiles"][-1]["args"]["mem-fraction-static"] = 0.7  # not the running profile
        path.write_text(yaml.safe_dump(data))
        await sup.reloader.reload()

    asyncio.run(serve_then_reload())
    assert sup.fp != old_fp and sup.lifecycle.attempt == 1  # the engine was kept
    assert sup.store.last_good(sup.fp) == "tuned"
    info = sup.metrics.active_profile._value
    assert info["config_hash"] == sup.fp and info["profile"] == "tuned"


def supervisor_whose_reads_hang(tmp_path: Path) -> Supervisor:
    """A supervisor with a configuration file whose reload read never returns."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(demo_data(tmp_path)))
    sup = Supervisor(prepare(parse_config(path.read_text()), VERSION),
                     Options(config_path=str(path), environ={}))

    async def hung(_path: str) -> Any:
        await asyncio.Event().wait()  # never set: a read that never returns

    sup.reloader._read = hung  # type: ignore[method-assign]
    return sup


def test_a_reload_that_cannot_read_its_file_in_time_is_refused_and_frees_the_inbox(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A reload holds the lifecycle loop (signals wait for it): a file on a hung mount must not
    hold it for ever. Nothing of the new file is applied."""
    sup = supervisor_whose_reads_hang(tmp_path)
    monkeypatch.setattr(reloader, "READ_TIMEOUT_S", 0.05)
    prep, fp = sup.prep, sup.fp
    asyncio.run(sup.reloader.reload())
    assert sup.reloader.last is not None and sup.reloader.last["result"] == "refused"
    assert "took more than" in sup.reloader.last["reason"]
    assert sup.prep is prep and sup.fp == fp


def test_a_stop_signal_ends_a_reload_still_reading_its_file(tmp_path: Path, monkeypatch: Any) -> None:
    """The stop waits behind the reload in the inbox; nothing of the reload is applied before its
    file is read, so a SIGTERM gives the read up instead of waiting READ_TIMEOUT_S."""
    sup = supervisor_whose_reads_hang(tmp_path)
    monkeypatch.setattr(reloader, "READ_TIMEOUT_S", 3600.0)
    prep, fp = sup.prep, sup.fp

    async def reload_then_stop() -> None:
        task = asyncio.create_task(sup.reloader.reload())
        while sup.reloader._give_up is None:
            await asyncio.sleep(0)
        sup._stop_signal("SIGTERM")
        await task

    asyncio.run(reload_then_stop())
    assert sup.reloader.last is not None and sup.reloader.last["result"] == "refused"
    assert sup.reloader.last["reason"] == "abandoned: SIGTERM arrived while the file was being read"
    assert sup.prep is prep and sup.fp == fp
    assert sup.inbox.pending() == (StopRequested("SIGTERM"),)
    sup.reloader.abandon_read("no reload is reading: nothing happens")
    assert sup.reloader.last["reason"].startswith("abandoned: SIGTERM")

HUNG_RELOAD_SCRIPT = """
import asyncio, copy, os, sys, yaml
from pathlib import Path
from sglang_supervisor.core.config import parse_config
from sglang_supervisor.shell import reloader
from sglang_supervisor.shell.files.configfile import default_demo_config_path
from sglang_supervisor.shell.supervisor import Options, Supervisor, prepare

tmp = Path(sys.argv[1])
data = copy.deepcopy(yaml.safe_load(default_demo_config_path().read_text()))
data.update(state_dir=str(tmp / "state"), runtime_dir=str(tmp / "run"), metrics={"enabled": False})
data["engine"]["log_file"] = str(tmp / "engine.log")
fifo = tmp / "config.yaml"
os.mkfifo(fifo)  # opening it for reading blocks until a writer comes: none ever does
sup = Supervisor(prepare(parse_config(yaml.safe_dump(data)), "0.5.23"),
                 Options(config_path=str(fifo), environ={}))
reloader.READ_TIMEOUT_S = 0.2
asyncio.run(sup.reloader.reload())
print("RESULT", sup.reloader.last["result"], flush=True)
"""


def test_a_reload_blocked_for_ever_on_its_file_does_not_keep_the_supervisor_from_exiting(
        tmp_path: Path) -> None:
    """The thread that reads the file cannot be interrupted; it must not be joined at exit either
    (asyncio.run joins the default executor's threads, the interpreter joins non-daemon ones): a
    config path that became a FIFO would make `systemctl stop` wait for SIGKILL."""
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", HUNG_RELOAD_SCRIPT, str(tmp_path)],
                              capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError("the process never exited: the blocked reader thread was joined") from None
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "RESULT refused", done.stdout[-2000:]


def test_a_reload_the_real_parser_refuses_is_refused_before_anything_drains(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The reloader puts the changed profiles to reloadcheck (the installed SGLang's parser) and
    refuses the reload on its verdict; a parser that cannot run leaves the catalogue's verdict."""
    data = demo_data(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    sup = Supervisor(prepare(parse_config(path.read_text()), VERSION),
                     Options(config_path=str(path), environ={}))
    data["profiles"][0].setdefault("args", {})["max-running-requests"] = 32
    path.write_text(yaml.safe_dump(data))
    asked: list[list[str]] = []
    verdict: tuple[list[ConfigProblem], str | None] = (
        [ConfigProblem("profiles.tuned", "the real sglang parser rejects this profile: nope", "fix it")],
        None)

    def fake(new: Any, names: Any, environ: Any, **_: Any) -> tuple[list[ConfigProblem], str | None]:
        asked.append(list(names))
        return verdict

    monkeypatch.setattr(reloadcheck, "real_parser_problems", fake)
    prep = sup.prep
    asyncio.run(sup.reloader.reload())
    assert asked == [["tuned"]]
    assert sup.reloader.last is not None and sup.reloader.last["result"] == "refused"
    assert "profiles.tuned: the real sglang parser rejects" in sup.reloader.last["reason"]
    assert sup.prep is prep
    verdict = ([], "sglang is not importable there")
    asyncio.run(sup.reloader.reload())
    assert sup.reloader.last["result"] == "applied" and sup.prep is not prep
