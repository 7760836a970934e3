"""Supervisor configuration: YAML -> validated, frozen model.

Field names here are the contract for every other module (and docs/CONFIG.md). Loading and the
human-readable error report live in `load_config`; validation errors name the key path, the
problem and the fix.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ArgScalar = str | int | float | bool
# A flag's value: true = bare flag, false/null = left out, a list = several values (nargs).
ArgValue = ArgScalar | list[str | int | float] | None

PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSettings(_Strict):
    # argv prefix that starts SGLang, e.g. ["/opt/sglang/bin/python3", "-m", "sglang.launch_server"]
    # or ["/opt/sglang/bin/sglang", "serve"]. "{python}" stands for the supervisor's own interpreter
    # (used by the demo to run the simulator).
    command: Annotated[list[str], Field(min_length=1)]
    # "auto" asks the engine's interpreter which sglang is installed.
    version: str = "auto"
    # Interpreter used for version detection and the real argument parser (doctor); default:
    # command[0] when it is a python, else the `python3` beside command[0].
    interpreter: str | None = None
    model_path: str
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 30000
    # Flags shared by every profile, without the leading "--": {"tp-size": 2, "trust-remote-code": true}
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    # The API key never goes on argv: it is read from a file or a systemd credential and handed to
    # SGLang through a 0600 `--config` YAML file in the runtime directory.
    api_key_file: str | None = None
    api_key_credential: str | None = None
    log_file: str = "/var/log/sglang-supervisor/engine.log"
    log_max_bytes: Annotated[int, Field(ge=1024)] = 100 * 1024 * 1024
    log_backups: Annotated[int, Field(ge=0, le=100)] = 5


class Profile(_Strict):
    name: str
    description: str = ""
    args: dict[str, ArgValue] = Field(default_factory=dict)  # added to / overriding engine.args
    remove: list[str] = Field(default_factory=list)  # flags of engine.args to drop
    env: dict[str, str] = Field(default_factory=dict)
    env_remove: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not PROFILE_NAME.match(v):
            raise ValueError(
                f"profile name {v!r} must be 1-63 characters of a-z, 0-9, '.', '_' or '-', "
                "starting with a letter or digit (it is used in metrics labels and file names)"
            )
        return v


class Timeouts(_Strict):
    stall_s: Annotated[float, Field(gt=0)] = 600.0  # no engine output while starting -> hang
    start_s: Annotated[float, Field(gt=0)] = 3600.0  # a whole start, however lively the log
    ready_probe_s: Annotated[float, Field(gt=0)] = 120.0  # the first probe that gates READY
    drain_s: Annotated[float, Field(ge=0)] = 30.0  # SIGTERM -> SIGKILL of the engine's group
    kill_s: Annotated[float, Field(gt=0)] = 10.0  # SIGKILL -> every process gone
    gpu_release_s: Annotated[float, Field(ge=0)] = 60.0  # wait for the old engine's GPU memory
    health_interval_s: Annotated[float, Field(gt=0)] = 10.0  # liveness check while serving
    health_timeout_s: Annotated[float, Field(gt=0)] = 30.0  # one check's timeout
    health_failures: Annotated[int, Field(ge=1)] = 3  # failed checks in a row -> wedged


class RestartPolicy(_Strict):
    same_profile_retries: Annotated[int, Field(ge=0)] = 1  # crash after ready: same profile again
    backoff_s: Annotated[float, Field(ge=0)] = 2.0  # pause before a relaunch
    known_bad_ttl_s: Annotated[float, Field(ge=0)] = 7 * 24 * 3600.0  # forget a bad profile after


class ProbeSettings(_Strict):
    enabled: bool = True
    interval_s: Annotated[float, Field(gt=0)] = 300.0
    input_tokens: Annotated[int, Field(ge=1)] = 256
    max_new_tokens: Annotated[int, Field(ge=2)] = 128
    timeout_s: Annotated[float, Field(gt=0)] = 120.0
    baseline_runs: Annotated[int, Field(ge=1)] = 3
    regression_delta: Annotated[float, Field(gt=0, lt=1)] = 0.15
    regression_window: Annotated[int, Field(ge=1)] = 3
    cooldown_s: Annotated[float, Field(ge=0)] = 3600.0
    act_on_regression: bool = True


class MetricsSettings(_Strict):
    enabled: bool = True
    address: str = "127.0.0.1:9400"


class LoggingSettings(_Strict):
    format: Literal["auto", "journald", "json", "console"] = "auto"
    forward_engine_output: bool = True


DEFAULT_REMEDIATION: dict[str, str] = {"default": "next"}


class Config(_Strict):
    name: str = "sglang"  # the deployment's name: metrics labels, state file, status output
    engine: EngineSettings
    profiles: Annotated[list[Profile], Field(min_length=1)]
    # failure class (events.FailureClass value, or "default") -> profile name, "next" or "stop"
    remediation: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_REMEDIATION))
    timeouts: Timeouts = Field(default_factory=Timeouts)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    state_dir: str = "/var/lib/sglang-supervisor"
    # Where the 0600 SGLang --config file (API key) goes; default $RUNTIME_DIRECTORY or state_dir.
    runtime_dir: str | None = None

    @model_validator(mode="after")
    def _profiles_unique(self) -> Config:
        seen: set[str] = set()
        for p in self.profiles:
            if p.name in seen:
                raise ValueError(f"profile name {p.name!r} is used twice; profile names must be unique")
            seen.add(p.name)
        return self

    def profile(self, name: str) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def profile_names(self) -> list[str]:
        return [p.name for p in self.profiles]
