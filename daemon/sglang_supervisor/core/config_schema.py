"""The configuration's schema: one frozen, strict model per section (engine, profiles, timeouts,
restart, probe, fidelity, metrics, gateway, upgrade, logging, group) and `Config`, the whole file.

Field names here are the contract for every other module (and docs/CONFIG.md); each bound is the
range `run` can use (config_values.py's ceilings). A validator that knows the fix raises
`FixableValueError`, so that the report (config_report.py) names the key, the problem and the fix.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sglang_supervisor.core.address import AddressError, parse_address
from sglang_supervisor.core.config_report import FixableValueError
from sglang_supervisor.core.config_values import (
    PROFILE_NAME,
    PROFILE_NAME_FIX,
    VERSION,
    WEEK_S,
    YEAR_S,
    ArgValue,
    check_arg_values,
    check_env_names,
    check_flag_list,
    check_flag_names,
    coerce_env,
    path_text,
)
from sglang_supervisor.core.failover import REMEDIATION_ACTIONS
from sglang_supervisor.core.group import GroupSettings
from sglang_supervisor.engine.sglang import NEWEST_KNOWN_VERSION


class _Strict(BaseModel):
    # strict: YAML `true` is no number and "10" no int; no inf/nan: every timeout must be usable.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class _ArgsAndEnv(_Strict):
    """The `args` and `env` that the engine section and every profile write, checked alike.

    The fields themselves stay declared in each subclass, in their own order."""

    _env_strings = field_validator("env", mode="before", check_fields=False)(coerce_env)
    _arg_values = field_validator("args", mode="before", check_fields=False)(check_arg_values)

    @field_validator("args", check_fields=False)
    @classmethod
    def _args_names(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        check_flag_names(v)
        return v

    @field_validator("env", check_fields=False)
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        check_env_names(v)
        return v


class CandidateSettings(_Strict):
    """A candidate SGLang release installed beside the current one (its own venv), proven by the
    upgrade canary (core/canary.py) before it serves."""

    python: str | None = None  # the candidate venv's interpreter, e.g. /opt/sglang-0.5.24/bin/python

    @field_validator("python")
    @classmethod
    def _python_path(cls, v: str | None) -> str | None:
        return None if v is None else path_text(v, "candidate python")


class UpgradeSettings(_Strict):
    """How much worse than the current release a candidate may measure and still be promoted."""

    min_tps_ratio: Annotated[float, Field(gt=0, le=10)] = 0.98
    max_ttft_ratio: Annotated[float, Field(gt=0, le=100)] = 1.10


class EngineSettings(_ArgsAndEnv):
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
    log_max_bytes: Annotated[int, Field(ge=1024, le=1 << 40)] = 100 * 1024 * 1024
    log_backups: Annotated[int, Field(ge=0, le=100)] = 5
    # The engine's kernel caches (Triton, inductor, TVM-FFI, flashinfer, deep_gemm, CUDA): under
    # this directory, one folder per SGLang release + torch + GPU (core/jitcache.py). None: the
    # unit's CacheDirectory ($CACHE_DIRECTORY). cache_max_gb bounds all key folders together
    # (least recently used pruned before a launch; 0: no bound).
    cache_dir: str | None = None
    cache_max_gb: Annotated[float, Field(ge=0, le=100_000)] = 20.0
    candidate: CandidateSettings = Field(default_factory=CandidateSettings)

    @field_validator("command")
    @classmethod
    def _command_words(cls, v: list[str]) -> list[str]:
        # A word may be a `sh -c` script: newlines and tabs belong there; NUL and the other
        # control characters cannot reach exec intact.
        for word in v:
            path_text(word.replace("\n", " ").replace("\t", " "), "command word")
        return v

    @field_validator("model_path", "host", "log_file")
    @classmethod
    def _plain_text(cls, v: str, info: ValidationInfo) -> str:
        return path_text(v, str(info.field_name).replace("_", " "))

    @field_validator("interpreter", "api_key_file", "cache_dir")
    @classmethod
    def _optional_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else path_text(v, str(info.field_name).replace("_", " "))

    @field_validator("cache_dir")
    @classmethod
    def _absolute_cache_dir(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise FixableValueError(f"cache dir {v!r} is not an absolute path",
                                    "write an absolute path, or remove the key for the unit's CacheDirectory")
        return v

    @field_validator("version")
    @classmethod
    def _version_shape(cls, v: str) -> str:
        if v != "auto" and not VERSION.match(v):
            raise FixableValueError(f"{v!r} is not a version",
                                    f'write "auto" or a release such as "{NEWEST_KNOWN_VERSION}"')
        return v

    @field_validator("api_key_credential")
    @classmethod
    def _credential_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or "/" in v or v in {".", ".."}):
            raise FixableValueError(f"{v!r} is not a credential name",
                                    "give the NAME of LoadCredential=NAME:PATH, not a path")
        return v

    @model_validator(mode="after")
    def _one_key_source(self) -> EngineSettings:
        if self.api_key_file is not None and self.api_key_credential is not None:
            raise FixableValueError("api_key_file and api_key_credential are both set", "keep one of them")
        return self

    @property
    def has_api_key(self) -> bool:
        return self.api_key_file is not None or self.api_key_credential is not None


class Profile(_ArgsAndEnv):
    name: str
    description: str = ""
    args: dict[str, ArgValue] = Field(default_factory=dict)  # added to / overriding engine.args
    remove: list[str] = Field(default_factory=list)  # flags of engine.args to drop
    env: dict[str, str] = Field(default_factory=dict)
    env_remove: list[str] = Field(default_factory=list)
    # Overlay another profile instead of engine's base flags (a ladder step that keeps the previous
    # step's changes). None: overlay engine.args/env directly.
    extends: str | None = None

    @field_validator("remove")
    @classmethod
    def _remove_names(cls, v: list[str]) -> list[str]:
        check_flag_list(v)
        return v

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not PROFILE_NAME.match(v):
            raise FixableValueError(
                f"profile name {v!r} is not allowed (it is used in metrics labels and file names)",
                PROFILE_NAME_FIX)
        if v in REMEDIATION_ACTIONS:
            # `remediation.capture_oom: stop` must have one meaning: the action, never a profile.
            raise FixableValueError(
                f"profile name {v!r} is a remediation action ({' and '.join(REMEDIATION_ACTIONS)} "
                "are reserved): a rule naming it would mean the action, not this profile",
                f"rename the profile, e.g. {v + '-profile'!r}, and the rules and 'extends' that name it")
        return v


class Timeouts(_Strict):
    stall_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 600.0  # no engine output while starting -> hang
    start_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 3600.0  # a whole start, however lively the log
    ready_probe_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 120.0  # the first probe that gates READY
    drain_s: Annotated[float, Field(ge=0, le=WEEK_S)] = 30.0  # SIGTERM -> SIGKILL of the engine's group
    kill_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 10.0  # SIGKILL -> every process gone
    gpu_release_s: Annotated[float, Field(ge=0, le=WEEK_S)] = 60.0  # wait for the old engine's GPU memory
    health_interval_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 10.0  # liveness check while serving
    health_timeout_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 30.0  # one check's timeout
    health_failures: Annotated[int, Field(ge=1, le=1000)] = 3  # failed checks in a row -> wedged


DerivableClass = Literal["flag_refused", "capture_oom", "prefill_graph_failed", "kv_cache_oom"]
# kv_cache_oom is opt-in: a larger memory fraction leaves less room for graphs and activations.
# prefill_graph_failed derives only when the attempt's failure said out of memory.
DEFAULT_DERIVE: tuple[DerivableClass, ...] = ("flag_refused", "capture_oom", "prefill_graph_failed")


class RestartPolicy(_Strict):
    same_profile_retries: Annotated[int, Field(ge=0, le=100)] = 1  # crash after ready: same profile again
    backoff_s: Annotated[float, Field(ge=0, le=WEEK_S)] = 2.0  # pause before a relaunch
    known_bad_ttl_s: Annotated[float, Field(ge=0, le=YEAR_S)] = WEEK_S  # forget a bad profile after
    # A profile that failed for a reason that may be transient (hang, wedge, timeouts, a killed
    # rank) is tried again after this long; each failure in a row doubles the wait (wayback.py).
    transient_retry_s: Annotated[float, Field(ge=0, le=YEAR_S)] = 3600.0
    # Port busy / GPU held by a stranger: wait this long (in all) for it to clear, then exit 75.
    # Longer than a third of systemd's StartLimitIntervalSec=1h, so repeated 75s never trip the
    # start limit (StartLimitBurst=4).
    temporary_wait_s: Annotated[float, Field(ge=0, le=WEEK_S, allow_inf_nan=False)] = 1200.0
    # Derived profiles (core/derive.py): the failure classes answered by the smallest change to
    # the failed profile before the next written rung, and how many such changes a rung gets.
    derive: list[DerivableClass] = Field(default_factory=lambda: list(DEFAULT_DERIVE))
    derived_steps: Annotated[int, Field(ge=0, le=8)] = 2


class ProbeSettings(_Strict):
    enabled: bool = True
    interval_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 300.0
    input_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    max_new_tokens: Annotated[int, Field(ge=2, le=100_000)] = 128
    timeout_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 120.0
    baseline_runs: Annotated[int, Field(ge=1, le=1000)] = 3
    regression_delta: Annotated[float, Field(gt=0, lt=1)] = 0.15
    regression_window: Annotated[int, Field(ge=1, le=1000)] = 3
    cooldown_s: Annotated[float, Field(ge=0, le=YEAR_S)] = 3600.0
    act_on_regression: bool = True


class FidelitySettings(_Strict):
    """Output-fidelity checks (core/fidelity.py): at every start before READY, while serving,
    in `tune`. The reference is taken under `reference_profile` (default: the last rung)."""

    enabled: bool = True
    reference_profile: str | None = None
    # Periodic check while serving, only when the engine is idle; 0: off. The default costs
    # ~97 generated tokens an hour (core/fidelity.tokens_per_hour), < 0.1 % of 70 tok/s.
    interval_s: Annotated[float, Field(ge=0, le=WEEK_S)] = 3600.0
    timeout_s: Annotated[float, Field(gt=0, le=WEEK_S)] = 60.0  # one whole sample
    prefix_tokens: Annotated[int, Field(ge=1, le=32)] = 16  # K: greedy tokens that must agree
    max_logprob_diff: Annotated[float, Field(gt=0, le=100)] = 0.25  # nats, teacher-forced mean
    accept_collapse_ratio: Annotated[float, Field(ge=0, le=1)] = 0.5


class MetricsSettings(_Strict):
    enabled: bool = True
    address: str = "127.0.0.1:9400"
    # /status on a non-loopback address hides pids, paths and fingerprints (core/exposure.py);
    # "full" shows them anyway, "redacted" hides them on loopback too.
    status_detail: Literal["auto", "full", "redacted"] = "auto"

    @field_validator("address")
    @classmethod
    def _host_port(cls, v: str) -> str:
        try:
            parse_address(v)
        except AddressError as exc:
            raise FixableValueError(exc.problem, exc.fix) from None
        return v


class GatewaySettings(_Strict):
    """The SGLang Model Gateway this replica registers with (docs/OPERATIONS.md, "Fleets").
    Without `url` the section is off: nothing is registered and no stop waits for a drain."""

    url: str | None = None  # the gateway's base URL, e.g. http://10.0.0.5:30080
    # The engine URL the gateway should call; default http://engine.host:engine.port (a wildcard
    # host is not routable from another machine: set this then).
    advertise_url: str | None = None
    # File holding the gateway's admin API key (sent as a bearer token); never in the config itself.
    api_key_file: str | None = None
    timeout_s: Annotated[float, Field(gt=0)] = 5.0  # one gateway call, answer read in full
    # Before a planned stop: deregister, then wait up to drain_s for the engine's in-flight
    # requests to reach zero; only then SIGTERM (and timeouts.drain_s) begins.
    drain_s: Annotated[float, Field(ge=0)] = 30.0
    retry_max_s: Annotated[float, Field(gt=0)] = 30.0  # longest pause between registration retries

    @field_validator("url", "advertise_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+(/[^\s]*)?$", v):
            raise FixableValueError(f"{v!r} is not an http(s) URL",
                                    "write e.g. http://10.0.0.5:30080 (scheme, host and port)")
        if v is not None and "@" in v.split("/", 3)[2]:
            # Both URLs are printed in log lines and /status: never with a password in them.
            raise FixableValueError("the URL holds credentials (user:password@), which would be "
                                    "printed in logs and /status",
                                    "remove them; put the gateway's key into gateway.api_key_file")
        return v.rstrip("/") if v is not None else v

    @property
    def enabled(self) -> bool:
        return self.url is not None


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
    fidelity: FidelitySettings = Field(default_factory=FidelitySettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    upgrade: UpgradeSettings = Field(default_factory=UpgradeSettings)
    state_dir: str = "/var/lib/sglang-supervisor"
    # Where the 0600 SGLang --config file (API key) goes; default $RUNTIME_DIRECTORY or state_dir.
    runtime_dir: str | None = None
    # A multi-node group (group.py): this node's rank, the leader's addresses, the restart mode.
    group: GroupSettings | None = None

    @field_validator("state_dir")
    @classmethod
    def _state_dir_text(cls, v: str) -> str:
        return path_text(v, "state directory")

    @field_validator("runtime_dir")
    @classmethod
    def _runtime_dir_text(cls, v: str | None) -> str | None:
        return None if v is None else path_text(v, "runtime directory")

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not PROFILE_NAME.match(v):
            raise FixableValueError(
                f"name {v!r} is not allowed (it names the state file and labels metrics)",
                PROFILE_NAME_FIX)
        return v

    def profile(self, name: str) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def profile_names(self) -> list[str]:
        return [p.name for p in self.profiles]
