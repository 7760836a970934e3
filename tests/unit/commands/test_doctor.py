"""doctor over the seed's qwen.yaml with the Qwen3.6-27B-like config.json, no GPU, no sglang here."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import stat
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from sglang_supervisor import cli
from sglang_supervisor.commands import doctor
from sglang_supervisor.core import audit
from sglang_supervisor.engine.modelinfo import read_model_dir
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.telemetry import gpu

ROOT = Path(__file__).resolve().parents[3]
SEED_CONFIG = ROOT / "etc" / "sglang-supervisor" / "qwen.yaml"
MODEL = ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-like"
REAL_PORT_BUSY = doctor.port_busy
REAL_SUPERVISOR_STATUS = doctor.supervisor_status
SERVER_INFO = ROOT / "tests" / "fixtures" / "sglang-0.5.17-h200" / "graphs.server_info.json"


def _no_module(name: str) -> object:
    raise ImportError(name)


@pytest.fixture(autouse=True)
def _host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without NVML whose ports are free, whatever machine runs the test."""
    monkeypatch.setattr(gpu, "_default", gpu.Nvml(loader=_no_module))
    monkeypatch.setattr(doctor, "port_busy", lambda host, port: False)
    monkeypatch.setattr(doctor, "supervisor_status", lambda address, timeout_s=0.0: None)  # no unit runs


def seed_config(tmp_path: Path, **engine: object) -> Path:
    data = yaml.safe_load(SEED_CONFIG.read_text())
    data["engine"].update(
        {
            "model_path": str(MODEL),
            "version": "0.5.23",
            "command": [str(tmp_path / "no-such-venv" / "python3"), "-m", "sglang.launch_server"],
            "log_file": str(tmp_path / "log" / "engine.log"),
            **engine,
        }
    )
    data["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "qwen.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = cli.main(["doctor", *argv])
    return rc, capsys.readouterr().out


def test_seed_config_reports_what_the_issue_asks_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = run_doctor(capsys, "--config", str(seed_config(tmp_path)), "--json")
    report = json.loads(out)
    by_code: dict[str, list[dict[str, str]]] = {}
    for f in report["findings"]:
        by_code.setdefault(f["code"], []).append(f)
    renamed = " ".join(f["what"] + f["fix"] for f in by_code["flag.renamed"])
    # the two removed flags and their replacements
    assert "--mamba-scheduler-strategy" in renamed and "--mamba-radix-cache-strategy extra_buffer" in renamed
    assert "--enforce-piecewise-cuda-graph" in renamed and "--cuda-graph-backend-prefill breakable" in renamed
    # --language-only's real meaning and port
    lang = by_code["language_only"][0]
    assert lang["profile"] == "tuned" and "8997" in lang["what"] and "disaggregation" in lang["what"]
    # single-batch overlap: MoE only
    sbo = by_code["single_batch_overlap"][0]
    assert sbo["severity"] == "warning" and "dense" in sbo["what"]
    # the spec-v2 env no-op
    assert "does nothing" in by_code["env.spec_v2"][0]["what"]
    # no NVML: said, and the audit went on
    assert by_code["host.nvml"][0]["severity"] == "warning"
    assert report["host"]["nvml"] is False
    assert report["host"]["model"]["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    # no sglang in the configured venv: the real parser is skipped with a reason, not a traceback
    assert "parser.unavailable" in by_code
    assert report["engine"]["parser"].startswith("unavailable")
    assert report["errors"] == 0 and rc == 0


def test_json_shape_is_stable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(seed_config(tmp_path))
    _, first = run_doctor(capsys, "--config", path, "--json")
    _, second = run_doctor(capsys, "--config", path, "--json")
    assert first == second
    report = json.loads(first)
    assert list(report) == ["findings", "host", "engine", "errors"]
    for f in report["findings"]:
        assert list(f) == ["severity", "area", "code", "profile", "what", "why", "fix"]
        assert f["severity"] in ("error", "warning", "info", "ok")
        assert f["area"] in ("host", "engine", "audit", "live")
    areas = [f["area"] for f in report["findings"]]
    assert areas == sorted(areas, key=["host", "engine", "audit", "live"].index)
    assert {"interpreter", "version", "version_source", "parser", "profiles", "tp_size"} <= set(
        report["engine"]
    )
    assert {"nvml", "gpus", "tp_link", "shm_bytes", "memlock_soft", "ports", "dirs", "model"} <= set(
        report["host"]
    )


def test_human_report_groups_by_area(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run_doctor(capsys, "--config", str(seed_config(tmp_path)))
    assert rc == 0
    assert out.index("== Host") < out.index("== Engine") < out.index("== Audit")
    assert "NVML is not available" in out and "-- profile tuned" in out
    assert out.rstrip().splitlines()[-1].startswith("0 error(s)")


def test_error_findings_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run_doctor(capsys, "--config", str(seed_config(tmp_path, model_path=str(tmp_path / "missing"))))
    assert rc == 1
    # a missing local model is a configuration error now (check and run exit 78 on it)
    assert "engine.model_path" in out and "does not exist" in out


def test_bad_config_is_a_finding_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: {command: [x]}\nprofiles: []\n")
    rc, out = run_doctor(capsys, "--config", str(bad), "--json")
    assert rc == 1
    assert {f["code"] for f in json.loads(out)["findings"]} == {"config.invalid"}


FAKE_SERVER_ARGS = """
class ServerArgs:
    @staticmethod
    def add_cli_args(p):
        p.add_argument("--model-path", required=True)
        p.add_argument("--tp-size", type=int, default=1)
        p.add_argument("--mamba-radix-cache-strategy", choices=["auto", "extra_buffer"])
        p.add_argument("--language-only", action="store_true")
"""


def fake_engine_python(tmp_path: Path) -> str:
    """An interpreter whose venv has a tiny stand-in `sglang` (the compat tier uses the real one)."""
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "server_args.py").write_text(FAKE_SERVER_ARGS)
    wrapper = tmp_path / "python3"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def test_real_parser_protocol_with_a_stand_in_sglang(tmp_path: Path) -> None:
    python = fake_engine_python(tmp_path)
    answer, why = doctor.run_argcheck(
        python,
        {
            "ok": ["--model-path", "m", "--tp", "2"],
            "bad": ["--model-path", "m", "--mamba-scheduler-strategy", "extra_buffer"],
            "choice": ["--model-path", "m", "--mamba-radix-cache-strategy", "bogus"],
        },
        list_options=True,
    )
    assert why is None and answer is not None
    res = answer["results"]
    assert res["ok"] == {"unknown": [], "error": None, "abbreviations": {"--tp": "--tp-size"}}
    assert res["bad"]["unknown"] == ["--mamba-scheduler-strategy", "extra_buffer"]
    assert "invalid choice" in res["choice"]["error"]
    assert "--language-only" in answer["options"]


def test_real_parser_absent_is_reported_gracefully() -> None:
    answer, why = doctor.run_argcheck(sys.executable, {"p": ["--model-path", "m"]})
    assert answer is None and why is not None and "sglang" in why
    answer, why = doctor.run_argcheck("/nonexistent/python3", {})
    assert answer is None and why is not None and "does not exist" in why


def test_live_mode_reads_server_info_and_redacts(tmp_path: Path) -> None:
    info = json.loads(SERVER_INFO.read_text())
    info["api_key"] = "sk-very-secret"
    metrics = (
        "# TYPE sglang:cuda_graph_passes counter\n"
        'sglang:cuda_graph_passes_total{mode="decode_none",model_name="m"} 7.0\n'
        'sglang:cuda_graph_passes_total{mode="decode_cuda_graph",model_name="m"} 90.0\n'
    )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server_info":
            return httpx.Response(404)
        if request.url.path == "/get_server_info":
            return httpx.Response(200, json=info)
        return httpx.Response(200, text=metrics)

    report = doctor.Report()
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        doctor.live_report("http://engine:30000", report, None, client)
    assert report.live is not None
    text = json.dumps(report.live)
    assert "sk-very-secret" not in text and "<redacted>" in text
    assert report.live["summary"]["version"] == "0.5.17"
    assert report.live["decode_none_passes"] == 7.0
    codes = {f.code for f in report.findings}
    assert {"live.summary", "live.decode_graph", "live.decode_none"} <= codes


def test_live_only_without_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake(url: str, report: doctor.Report, api_key: str | None, client: object = None) -> None:
        report.live = {"url": url}

    monkeypatch.setattr(doctor, "live_report", fake)
    args = argparse.Namespace(config=os.devnull + ".missing", url="http://x:1", json=True)
    assert doctor.main(args) == 0
    assert json.loads(capsys.readouterr().out)["live"] == {"url": "http://x:1"}


class _OnePathServer:
    """An HTTP server on a free loopback port: GET `path` gets `status` and `body`, any other path
    a 404 with the same body."""

    def __init__(self, path: str, status: int, body: bytes) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status if self.path == path else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Listener(_OnePathServer):
    """SGLang's /model_info, or a stranger's 404."""

    def __init__(self, model_info: dict[str, object] | None) -> None:
        if model_info is None:
            super().__init__("/model_info", 404, b"not found")
        else:
            super().__init__("/model_info", 200, json.dumps(model_info).encode())


@pytest.mark.parametrize("sglang", [True, False])
def test_busy_engine_port_tells_a_running_sglang_from_a_stranger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sglang: bool
) -> None:
    monkeypatch.setattr(doctor, "port_busy", REAL_PORT_BUSY)  # the autouse fixture stubbed it
    listener = _Listener({"model_path": str(MODEL), "is_generation": True} if sglang else None)
    try:
        config = load_config(seed_config(tmp_path, host="127.0.0.1", port=listener.port))
        facts, summary = doctor.gather_host(config, {}, 1, {})
    finally:
        listener.close()
    got = [f for f in audit.host_findings(facts, 1) if f.code.startswith("host.port")]
    engine = [f for f in got if f"port {listener.port} " in f.what]
    if sglang:
        assert [f.severity for f in engine] == ["info"]
        # this test process listens; no supervisor started it
        assert f"pid {os.getpid()}" in engine[0].what and "the configured model" in engine[0].what
        assert "not started by a sglang-supervisor" in engine[0].what
        assert summary["ports"][str(listener.port)] == "running"
    else:
        assert [f.severity for f in engine] == ["error"] and "already in use" in engine[0].what
        assert summary["ports"][str(listener.port)] == "busy"


def sglang_only_on_a_path(tmp_path: Path, version: str = "0.5.23") -> Path:
    """A folder holding a stand-in `sglang` (with its version metadata) that no interpreter finds
    unless PYTHONPATH names it: the host where SGLang is importable only that way."""
    site = tmp_path / "pp-site"
    fake_engine_python(site)  # writes site/site/sglang/...
    dist = site / "site" / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return site / "site"


@pytest.mark.parametrize("where", ["engine.env", "environment"])
def test_parser_and_version_run_in_the_engines_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    site = sglang_only_on_a_path(tmp_path)
    engine: dict[str, object] = {"version": "auto", "command": [sys.executable, "-m", "sglang.launch_server"]}
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if where == "engine.env":
        engine["env"] = {"PYTHONPATH": str(site)}
    else:
        environ["PYTHONPATH"] = str(site)
    config = load_config(seed_config(tmp_path, **engine))
    report = doctor.Report()
    doctor.config_report(config, report, environ=environ)
    assert report.engine["version"] == "0.5.23" and report.engine["version_source"] == "detected"
    assert report.engine["parser"] == f"sglang 0.5.23 via {sys.executable}"
    assert "parser.unavailable" not in {f.code for f in report.findings}
    # the seed's removed flag is now reported by the real parser, per profile
    assert any(f.code.startswith("parser.") for f in report.findings)


def test_the_parser_runs_once_per_distinct_engine_environment(tmp_path: Path) -> None:
    path = seed_config(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["profiles"][-1].setdefault("env", {})["PYTHONPATH"] = "/opt/other-site"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    last = config.profiles[-1].name
    calls: list[tuple[list[str], str | None, bool]] = []

    def runner(interpreter: str, argvs: dict[str, list[str]], *, env: dict[str, str]
               ) -> tuple[dict[str, object], None]:
        calls.append((sorted(argvs), env.get("PYTHONPATH"), "NOTIFY_SOCKET" in env))
        return {"ok": True, "version": "0.5.23", "results": {}}, None

    report = doctor.Report()
    doctor.config_report(config, report, runner=runner,
                         environ={"NOTIFY_SOCKET": "/run/x", "PYTHONPATH": "/opt/site"})
    # the last profile's engine gets its own PYTHONPATH, the others the supervisor's; never systemd's
    others = sorted(p.name for p in config.profiles[:-1])
    assert sorted(calls) == sorted([([last], "/opt/other-site", False), (others, "/opt/site", False)])
    assert report.engine["parser"].startswith("sglang 0.5.23")


def _gpu(index: int, procs: tuple[tuple[int, int], ...], used: int) -> gpu.GpuInfo:
    return gpu.GpuInfo(index, f"GPU-{index}", "NVIDIA H200", "9.0", "580", used, 141 * 2**30, None,
                       None, None, None, None, None, (),
                       tuple(gpu.GpuProcess(pid, size) for pid, size in procs))


def test_the_running_engines_gpu_processes_are_ours_not_foreign() -> None:
    gib = 2**30
    gpus = [_gpu(0, ((31, 120 * gib), (77, 2 * gib)), 122 * gib), _gpu(1, ((32, 120 * gib),), 120 * gib)]
    ours = {30: "python3 -m sglang.launch_server", 31: "sglang::scheduler_TP0",
            32: "sglang::scheduler_TP1"}
    engine, foreign = doctor.gpu_process_lines(gpus, ours, title=lambda pid: "python3 train.py")
    assert engine == ["our engine (pid 31, sglang::scheduler_TP0) on GPU0, 120.0 GiB",
                      "our engine (pid 32, sglang::scheduler_TP1) on GPU1, 120.0 GiB"]
    assert foreign == ["GPU0 pid 77 (python3 train.py) 2.0 GiB"]
    facts = audit.HostFacts(nvml=True, gpus=tuple(gpus), foreign=tuple(foreign),
                            engine_gpu=tuple(engine),
                            engine_gpu_bytes={0: gpu.held_by(gpus[:1], ours), 1: gpu.held_by(gpus[1:], ours)},
                            model=read_model_dir(MODEL))
    got = audit.host_findings(facts, 2, 0.88)
    by_code = {f.code: [x for x in got if x.code == f.code] for f in got}
    assert [f.severity for f in by_code["host.engine_gpu"]] == ["info", "info"]
    assert "sglang::scheduler_TP0" in by_code["host.engine_gpu"][0].what
    assert [f.severity for f in by_code["host.foreign"]] == ["warning"]
    assert "train.py" in by_code["host.foreign"][0].what
    # the engine's own memory comes back on a restart: the weights still fit
    assert "host.memory" not in by_code
    assert not audit.has_errors(got)
    # without knowing the engine, the same GPUs are full: an error, and every process foreign
    _, all_foreign = doctor.gpu_process_lines(gpus, {}, title=lambda pid: "sglang::scheduler_TP0")
    assert len(all_foreign) == 3
    full = audit.host_findings(audit.HostFacts(nvml=True, gpus=tuple(gpus), model=read_model_dir(MODEL)),
                               2, 0.88)
    assert "host.memory" in {f.code for f in full if f.severity == "error"}


def test_gather_host_asks_who_serves_the_engine_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(seed_config(tmp_path))
    gpus = [_gpu(0, ((31, 2**30), (77, 2**30)), 2 * 2**30)]
    monkeypatch.setattr(gpu, "_default", type("N", (), {
        "available": lambda self: True, "snapshot": lambda self: gpus,
        "p2p_link": lambda self, a, b: "nvlink"})())
    monkeypatch.setattr(doctor, "port_busy", lambda host, port: port == config.engine.port)
    monkeypatch.setattr(doctor, "port_holder", lambda c, port, key: "SGLang already running (pid 30)")
    monkeypatch.setattr(doctor.ports, "server_processes",
                        lambda port: {30: "python3", 31: "sglang::scheduler_TP0"}
                        if port == config.engine.port else {})
    monkeypatch.setattr(doctor.ports, "process_title", lambda pid: "python3 train.py")
    facts, summary = doctor.gather_host(config, {}, 1, {})
    assert facts.engine_gpu == ("our engine (pid 31, sglang::scheduler_TP0) on GPU0, 1.0 GiB",)
    assert facts.foreign == ("GPU0 pid 77 (python3 train.py) 1.0 GiB",)
    assert facts.engine_gpu_bytes == {0: 2**30}
    assert summary["engine_gpu_processes"] == list(facts.engine_gpu)


def test_a_value_of_the_wrong_type_is_an_error_finding(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28: doctor must find `max-running-requests: banana` (the real parser is absent here:
    the catalogue's recorded types find it)."""
    path = seed_config(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["profiles"][0].setdefault("args", {})["max-running-requests"] = "banana"
    path.write_text(yaml.safe_dump(data))
    rc, out = run_doctor(capsys, "--config", str(path), "--json")
    assert rc == 1
    errors = [f for f in json.loads(out)["findings"] if f["severity"] == "error"]
    assert any("invalid int value 'banana'" in json.dumps(f) for f in errors), errors


class _StatusServer(_OnePathServer):
    """A running supervisor's metrics listener, answering /status."""

    def __init__(self, doc: dict[str, object]) -> None:
        super().__init__("/status", 200, json.dumps(doc).encode())


@pytest.mark.parametrize("stale", [True, False])
def test_a_unit_running_code_older_than_the_package_is_a_finding_with_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stale: bool
) -> None:
    monkeypatch.setattr(doctor, "supervisor_status", REAL_SUPERVISOR_STATUS)  # the fixture stubbed it
    monkeypatch.setattr(doctor.unitcheck, "unit_view", lambda config, path: None)  # no systemd here
    server = _StatusServer({"profile": "tuned", "code_stale": stale, "supervisor_version": "0.9.1"})
    try:
        path = seed_config(tmp_path)
        data = yaml.safe_load(path.read_text())
        data["metrics"]["address"] = f"127.0.0.1:{server.port}"
        path.write_text(yaml.safe_dump(data))
        _, out = run_doctor(capsys, "--config", str(path), "--json")
    finally:
        server.close()
    found = [f for f in json.loads(out)["findings"] if f["code"] == "live.code_stale"]
    if not stale:
        assert found == []
        return
    [f] = found
    assert f["severity"] == "warning"
    assert "sglang-supervisor@qwen.service runs supervisor code (0.9.1) older than the installed" in f["what"]
    assert f["fix"] == "systemctl restart sglang-supervisor@qwen"


def test_code_stale_reads_only_a_true_code_stale() -> None:
    unit = "sglang-qwen.service"
    [f] = audit.code_stale_findings({"code_stale": True}, unit)
    assert f.fix == "systemctl restart sglang-qwen" and "(" not in f.what
    for odd in (None, [], {"code_stale": "yes"}, {"code_stale": 1}, {"code_stale": False}, {}):
        assert audit.code_stale_findings(odd, unit) == []


def test_a_remembered_derived_profile_is_a_finding_with_its_base_change_and_the_way_to_drop_it(
        tmp_path: Path) -> None:
    """Issue 25 D: `run` may start a derived profile first; doctor says what it is and why."""
    from sglang_supervisor.commands.doctorreport import Report
    from sglang_supervisor.core.derive import Derivation
    from sglang_supervisor.shell.files.state import StateStore

    repo = Path(__file__).resolve().parents[3]
    data = yaml.safe_load((repo / "etc" / "sglang-supervisor" / "demo.yaml").read_text())
    data["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    report = Report()
    doctor.derived_findings(config, report)
    assert report.findings == [] and "derived_profiles" not in report.engine  # nothing remembered
    d = Derivation("tuned-no-sbo", "tuned", ("enable-single-batch-overlap",), {}, 1,
                   "drop --enable-single-batch-overlap", "ValueError: SBO ... Please try removing "
                   "--enable-single-batch-overlap argument.")
    StateStore(config.state_dir, config.name).mark_serving("fp", d.name, 1.0, False, derived=d)
    doctor.derived_findings(config, report)
    [f] = report.findings
    assert f.code == "derived.remembered" and f.profile == "tuned-no-sbo"
    assert "tuned with drop --enable-single-batch-overlap" in f.what and "Please try removing" in f.why
    assert "forget --profile tuned-no-sbo" in f.fix
    assert report.engine["derived_profiles"]["tuned-no-sbo"]["base"] == "tuned"
