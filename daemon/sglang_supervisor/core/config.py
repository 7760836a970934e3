"""Supervisor configuration: YAML -> validated, frozen model.

Field names here are the contract for every other module (and docs/CONFIG.md). Validation
errors name the key path, the problem and the fix. Pure: reading the file and checking the files
it names (API key files, a local model) is `shell.configfile.load_config`'s.

Long because: the schema, its bounds and the report that explains a violation of each are one
contract; split, a field and the message that names its problem would drift apart.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from sglang_supervisor.core.address import AddressError, parse_address
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.failover import REMEDIATION_ACTIONS
from sglang_supervisor.core.group import GroupSettings
from sglang_supervisor.engine.argv import MANAGED_FLAGS
from sglang_supervisor.engine.sglang import NEWEST_KNOWN_VERSION

ArgScalar = str | int | float | bool
# A flag's value: true = bare flag, false/null = left out, a list = several values (nargs).
ArgValue = ArgScalar | list[str | int | float] | None

PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}\Z")  # \Z: `$` lets "name\n" in


FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.+-]?[A-Za-z0-9.+-]*)?\Z")

# Flags the supervisor sets itself: written in args they would fight with the typed settings.
# Which SGLang flags those are is engine knowledge (engine/argv.MANAGED_FLAGS); what to write
# instead is the configuration's.
_MANAGED_FIX: dict[str, str] = {
    "model": "set engine.model_path instead",
    "host": "set engine.host instead",
    "port": "set engine.port instead",
    "api_key": "put the key in a file and set engine.api_key_file (or engine.api_key_credential); "
    "a key on the command line is visible to every user in the process table",
    "admin_api_key": "keep secrets off the command line; the supervisor does not pass admin keys",
    "config_file": "the supervisor passes its own --config file (for the API key); remove this flag",
}
RESERVED_FLAGS: dict[str, str] = {flag: _MANAGED_FIX[role] for flag, role in MANAGED_FLAGS.items()}


# Upper bounds: every value `check` accepts must be one `run` can use (timers, EXTEND_TIMEOUT_USEC).
WEEK_S = 7 * 24 * 3600.0
YEAR_S = 365 * 24 * 3600.0
# A Hugging Face model id: `name` or `org/name` (letters, digits, '-', '_', '.'; no '..').
HF_ID = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?\Z")


def _control_chars(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _path_text(v: str, what: str) -> str:
    """A path, host or command word: empty or with control characters (a NUL ends `run` at
    exec time; a newline hides in logs) is refused at `check` time."""
    if not v.strip():
        raise FixableValueError(f"{what} is empty", f"write the {what} or remove the key for its default")
    if _control_chars(v):
        raise FixableValueError(f"{what} {v[:60]!r} contains control characters",
                                "remove them (an escape like \\n in a double-quoted YAML string?)")
    return v


class FixableValueError(ValueError):
    """A validator's verdict with the fix kept apart, so the report can print both."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} ({fix})")


class _Strict(BaseModel):
    # strict: YAML `true` is no number and "10" no int; no inf/nan: every timeout must be usable.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _flag_name_error(key: str) -> FixableValueError | None:
    if key.startswith("-"):
        return FixableValueError(f"flag {key!r} starts with dashes", f"write {key.lstrip('-')!r}")
    if "_" in key:
        return FixableValueError(f"flag {key!r} has underscores; SGLang's flags use dashes",
                                 f"write {key.replace('_', '-')!r}")
    if not FLAG_NAME.match(key):
        return FixableValueError(f"{key!r} is not a command-line flag name",
                                 "use the long flag without dashes, e.g. tp-size")
    if key in RESERVED_FLAGS:
        return FixableValueError(f"flag {key!r} is managed by the supervisor", RESERVED_FLAGS[key])
    return None


def _arg_value_error(key: object, value: object) -> FixableValueError | None:
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, str) and "\0" in item:
            return FixableValueError(f"flag {key!s}: the value contains a NUL character",
                                     "no command-line argument can hold one; remove it")
        in_list = isinstance(value, list)
        if isinstance(item, dict | list) or (in_list and (item is None or isinstance(item, bool))):
            return FixableValueError(
                f"flag {key!s}: {item!r} cannot be written on a command line",
                "use a string or number, true (bare flag), false/null (left out), "
                "or a list of strings/numbers (several values)")
        if not isinstance(item, str | int | float | bool | None):
            return FixableValueError(f"flag {key!s}: {type(item).__name__} value {item!r}",
                                     "quote it to make it a string")
    return None


def _env_value_error(key: object, value: object) -> FixableValueError | None:
    if isinstance(value, bool):
        return FixableValueError(f"env {key!s}: {value!r} is a YAML boolean, not a string",
                                 'quote the value you mean, e.g. "1" or "true"')
    if isinstance(value, str) and "\0" in value:
        return FixableValueError(f"env {key!s}: the value contains a NUL character",
                                 "no environment variable can hold one; remove it")
    return None


def _env_name_error(key: str) -> FixableValueError | None:
    if not ENV_NAME.match(key):
        return FixableValueError(f"{key!r} is not an environment variable name",
                                 "use letters, digits and '_', not starting with a digit")
    return None


def _raise_first(errors: Iterable[FixableValueError | None]) -> None:
    for err in errors:
        if err is not None:
            raise err


def _check_flag_names(args: Mapping[str, object]) -> None:
    _raise_first(_flag_name_error(k) for k in args)


def _check_arg_values(v: object) -> object:
    """Say which flag holds a value that cannot become argv (instead of pydantic's union noise)."""
    if isinstance(v, dict):
        _raise_first(_arg_value_error(k, x) for k, x in v.items())
    return v


def _check_flag_list(names: Sequence[str]) -> None:
    _raise_first(
        FixableValueError(f"flag {k!r} starts with dashes", f"write {k.lstrip('-')!r}")
        for k in names if k.startswith("-"))


def _coerce_env(v: object) -> object:
    """YAML reads `SGLANG_X: 1` as an int; the environment only holds strings."""
    if not isinstance(v, dict):
        return v
    _raise_first(_env_value_error(k, x) for k, x in v.items())
    return {k: str(x) if isinstance(x, int | float) else x for k, x in v.items()}


def _check_env_names(env: Mapping[str, str]) -> None:
    _raise_first(_env_name_error(k) for k in env)


def _raw_problems(data: Mapping[object, object]) -> list[ConfigProblem]:
    """Per-key checks of flags and environment on the raw YAML, so that every bad key is named
    (a pydantic validator stops at the first one of a mapping)."""
    out: list[ConfigProblem] = []

    def check_block(block: object, prefix: str) -> None:
        if not isinstance(block, dict):
            return
        args, env, remove = block.get("args"), block.get("env"), block.get("remove")
        if isinstance(args, dict):
            for k, v in args.items():
                if not isinstance(k, str):
                    continue
                err = _flag_name_error(k) or _arg_value_error(k, v)
                if err is not None:
                    out.append(ConfigProblem(f"{prefix}.args.{k}", err.problem, err.fix))
        if isinstance(env, dict):
            for k, v in env.items():
                if not isinstance(k, str):
                    continue
                err = _env_name_error(k) or _env_value_error(k, v)
                if err is not None:
                    out.append(ConfigProblem(f"{prefix}.env.{k}", err.problem, err.fix))
        if isinstance(remove, list):
            for i, k in enumerate(remove):
                if isinstance(k, str) and k.startswith("-"):
                    out.append(ConfigProblem(f"{prefix}.remove[{i}]", f"flag {k!r} starts with dashes",
                                             f"write {k.lstrip('-')!r}"))

    check_block(data.get("engine"), "engine")
    profiles = data.get("profiles")
    if isinstance(profiles, list):
        for i, profile in enumerate(profiles):
            check_block(profile, f"profiles[{i}]")
    return out


class _ArgsAndEnv(_Strict):
    """The `args` and `env` that the engine section and every profile write, checked alike.

    The fields themselves stay declared in each subclass, in their own order."""

    _env_strings = field_validator("env", mode="before", check_fields=False)(_coerce_env)
    _arg_values = field_validator("args", mode="before", check_fields=False)(_check_arg_values)

    @field_validator("args", check_fields=False)
    @classmethod
    def _args_names(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        _check_flag_names(v)
        return v

    @field_validator("env", check_fields=False)
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        _check_env_names(v)
        return v


class CandidateSettings(_Strict):
    """A candidate SGLang release installed beside the current one (its own venv), proven by the
    upgrade canary (core/canary.py) before it serves."""

    python: str | None = None  # the candidate venv's interpreter, e.g. /opt/sglang-0.5.24/bin/python

    @field_validator("python")
    @classmethod
    def _python_path(cls, v: str | None) -> str | None:
        return None if v is None else _path_text(v, "candidate python")


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
            _path_text(word.replace("\n", " ").replace("\t", " "), "command word")
        return v

    @field_validator("model_path", "host", "log_file")
    @classmethod
    def _plain_text(cls, v: str, info: ValidationInfo) -> str:
        return _path_text(v, str(info.field_name).replace("_", " "))

    @field_validator("interpreter", "api_key_file", "cache_dir")
    @classmethod
    def _optional_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else _path_text(v, str(info.field_name).replace("_", " "))

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
        _check_flag_list(v)
        return v

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not PROFILE_NAME.match(v):
            raise FixableValueError(
                f"profile name {v!r} is not allowed (it is used in metrics labels and file names)",
                "use 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit")
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
        return _path_text(v, "state directory")

    @field_validator("runtime_dir")
    @classmethod
    def _runtime_dir_text(cls, v: str | None) -> str | None:
        return None if v is None else _path_text(v, "runtime directory")

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not PROFILE_NAME.match(v):
            raise FixableValueError(
                f"name {v!r} is not allowed (it names the state file and labels metrics)",
                "use 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit")
        return v

    def profile(self, name: str) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def profile_names(self) -> list[str]:
        return [p.name for p in self.profiles]


# --------------------------------------------------------------------------------------------
# Loading: YAML text -> Config, or a ConfigError listing every problem with its key path and fix.
# --------------------------------------------------------------------------------------------

KEY_SOURCE_ERROR_HINT = "see docs/CONFIG.md"
REMEDIATION_KEYS = (*(fc.value for fc in FailureClass), "default")

@dataclass(frozen=True)
class ConfigProblem:
    path: str  # key path, e.g. "profiles[2].args.tp-size"; "" for the whole file
    problem: str
    fix: str

    def __str__(self) -> str:
        where = self.path or "(file)"
        return f"{where}: {self.problem}\n    fix: {self.fix}"


# A hostile file must not produce an unbounded report (journal, terminal, --json).
MAX_PROBLEMS = 50
MAX_PROBLEM_CHARS = 300


def _clip(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM_CHARS else text[:MAX_PROBLEM_CHARS - 3] + "..."


def _bounded(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    out = [ConfigProblem(_clip(p.path), _clip(p.problem), _clip(p.fix)) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        out.append(ConfigProblem("", f"{len(problems) - MAX_PROBLEMS} more problems not shown",
                                 "fix the ones above first"))
    return out


class ConfigError(Exception):
    """An invalid configuration. `str()` is the report for humans; `problems` the data for --json."""

    def __init__(self, problems: list[ConfigProblem], source: str = "configuration") -> None:
        self.problems = _bounded(problems)
        self.source = _clip(source)
        super().__init__(self.report())

    def report(self) -> str:
        n = len(self.problems)
        head = f"{self.source}: {n} configuration problem{'s' if n != 1 else ''}"
        return "\n".join([head, *(f"  - {p!s}" for p in self.problems)])

    def __str__(self) -> str:
        return self.report()


# ---- YAML -----------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that records duplicate keys (PyYAML silently keeps the last one)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[str, yaml.Mark]] = []
        self._checked: set[int] = set()

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: set[str] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if key_node.value in seen:
                    self.duplicates.append((key_node.value, key_node.start_mark))
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _line_index(text: str) -> dict[tuple[str, ...], int]:
    """Key path (as strings) -> 1-based line of that key, to point at the spot in the file."""
    index: dict[tuple[str, ...], int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return index
    stack: list[tuple[tuple[str, ...], yaml.Node]] = [((), root)] if root is not None else []
    visited: set[int] = set()
    while stack:
        path, node = stack.pop()
        if id(node) in visited:  # aliases can make the node graph cyclic
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    sub = (*path, str(k.value))
                    index.setdefault(sub, k.start_mark.line + 1)
                    stack.append((sub, v))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                sub = (*path, str(i))
                index.setdefault(sub, v.start_mark.line + 1)
                stack.append((sub, v))
    return index


def _yaml_error(exc: yaml.YAMLError, source: str, text: str) -> ConfigProblem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    if isinstance(exc, yaml.reader.ReaderError):  # a bad character: only a stream offset is known
        before = text[: exc.position]
        where = f"{source}:{before.count(chr(10)) + 1}:{len(before) - before.rfind(chr(10))}"
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    text = f"{context}, {what}" if context else str(what)
    return ConfigProblem(
        path="",
        problem=f"YAML syntax error at {where}: {text}",
        fix="fix the YAML at that line and column (indentation with spaces, 'key: value', "
        "quote strings that contain ': ' or start with a special character)",
    )


# A configuration is a few hundred values; aliases may repeat a block, not multiply it a billion
# times ("billion laughs": pydantic would walk every copy).
MAX_CONFIG_BYTES = 256 << 10  # qwen.yaml, comments and all, is 8 KiB; PyYAML parses ~50 KiB/s
MAX_EXPANDED_NODES = 50_000


def _expanded_size(root: yaml.Node) -> int:
    """Nodes the document has once every alias is expanded (memoised: linear in the graph);
    stops counting past MAX_EXPANDED_NODES. A cycle raises RecursionError like the constructor."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise RecursionError("an alias refers to itself")
        active.add(key)
        total = 1
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                children += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        for child in children:
            total += size(child)
            if total > MAX_EXPANDED_NODES:
                break
        active.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _read_yaml(text: str, source: str) -> tuple[object, list[ConfigProblem]]:
    loader: _Loader | None = None
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError([ConfigProblem("", f"the file holds {len(text)} characters; a configuration "
                                         f"is a few KiB (limit {MAX_CONFIG_BYTES})",
                                         "point --config at the supervisor's YAML file")], source)
    try:
        loader = _Loader(text)  # the reader already rejects control characters here
        node = loader.get_single_node()
        if node is not None and _expanded_size(node) > MAX_EXPANDED_NODES:
            raise ConfigError([ConfigProblem(
                "", f"aliases expand the document to more than {MAX_EXPANDED_NODES} values",
                "use anchors and aliases (&name, *name) for a few shared blocks, not nested repeats")],
                source)
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_error(exc, source, text)], source) from None
    except RecursionError:
        raise ConfigError(
            [ConfigProblem("", "the YAML is nested too deeply (or an alias refers to itself)",
                           "flatten the document; a supervisor config is at most four levels deep")],
            source,
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    problems = [
        ConfigProblem(
            path=key,
            problem=f"key {key!r} appears twice in one mapping (again at line {mark.line + 1}, "
            f"column {mark.column + 1}); YAML would silently keep only the last one",
            fix="keep one of them (merge their contents)",
        )
        for key, mark in loader.duplicates
    ]
    return data, problems


# ---- pydantic errors -> problems -------------------------------------------------------------


def format_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _unwrap(tp: Any) -> Any:
    """Optional[X] / X | None -> X."""
    args = [a for a in get_args(tp) if a is not type(None)]
    if get_origin(tp) in (None, list, dict) or len(args) != 1:
        return tp
    return args[0]


def _type_at(loc: Sequence[str | int]) -> Any:
    """The declared type at a key path (None when the path leaves the schema)."""
    tp: Any = Config
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) is list and isinstance(part, int):
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return None
    return _unwrap(tp)


def _all_fields() -> dict[str, list[str]]:
    """field name -> the key paths where it is valid (for 'belongs under ...' hints)."""
    where: dict[str, list[str]] = {}

    def visit(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            path = f"{prefix}.{name}" if prefix else name
            where.setdefault(name, []).append(path)
            tp = _unwrap(field.annotation)
            if get_origin(tp) is list:
                tp = get_args(tp)[0]
                path += "[]"
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                visit(tp, path)

    visit(Config, "")
    return where


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _unknown_key_problem(loc: Sequence[str | int]) -> ConfigProblem:
    key = str(loc[-1])
    parent = _type_at(loc[:-1])
    valid = sorted(parent.model_fields) if isinstance(parent, type) and issubclass(parent, BaseModel) else []
    guess = did_you_mean(key, valid)
    if guess:
        fix = f"did you mean {guess!r}?"
    else:
        elsewhere = [p for p in _all_fields().get(key, []) if "." in p or "[" in p]
        where = format_path(loc[:-1]) or "the top level"
        if elsewhere:
            fix = f"{key!r} belongs under {elsewhere[0].rsplit('.', 1)[0]}, not {where}"
        else:
            fix = f"remove it; valid keys here: {', '.join(valid)}"
    return ConfigProblem(format_path(loc), f"unknown key {key!r}", fix)


_TYPE_FIXES = {
    "int": "write a whole number",
    "float": "write a number",
    "bool": "write true or false",
    "string": "write a string (quote it if YAML reads it as something else)",
    "list": "write a YAML list ([a, b] or '- a' lines)",
    "dict": "write a mapping ('key: value' lines)",
    "model": "write a mapping ('key: value' lines)",
}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _error_problem(err: ErrorDetails, loc: tuple[str | int, ...]) -> ConfigProblem:
    kind = err["type"]
    path = format_path(loc)
    msg = err["msg"]
    if kind == "extra_forbidden":
        return _unknown_key_problem(loc)
    if kind == "missing":
        parent = format_path(loc[:-1]) or "the top level"
        return ConfigProblem(path, f"required key {loc[-1]!s} is missing",
                             f"add '{loc[-1]!s}:' under {parent} ({KEY_SOURCE_ERROR_HINT})")
    if kind == "value_error":
        exc = (err.get("ctx") or {}).get("error")
        if isinstance(exc, FixableValueError):
            return ConfigProblem(path, exc.problem, exc.fix)
        text = str(exc) if exc is not None else msg.removeprefix("Value error, ")
        return ConfigProblem(path, text, "change the value as the message says")
    if kind in ("literal_error", "enum"):
        return ConfigProblem(path, f"{msg}; got {_short(err.get('input'))}", "use one of the listed values")
    if kind in ("too_short", "too_long"):
        return ConfigProblem(path, msg, "add or remove entries as the message says")
    for prefix, fix in _TYPE_FIXES.items():
        if kind.startswith(prefix):
            return ConfigProblem(path, f"{msg}; got {_short(err.get('input'))}", fix)
    if kind == "finite_number":
        return ConfigProblem(path, f"{_short(err.get('input'))} is not a finite number",
                             "write a number (.inf and .nan cannot be used as a duration or count)")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return ConfigProblem(path, f"{msg}; got {_short(err.get('input'))}",
                             "set a value in the allowed range")
    return ConfigProblem(path, f"{msg}; got {_short(err.get('input'))}", KEY_SOURCE_ERROR_HINT)


def _data_loc(data: object, loc: tuple[str | int, ...], kind: str) -> tuple[str | int, ...]:
    """Cut pydantic's loc back to keys that exist in the input (drops union branch names)."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        if part == "[key]":
            break
        present = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node))
        if present:
            node = node[part]  # type: ignore[index]
        else:
            if (kind in ("missing", "extra_forbidden") or not out) and i == len(loc) - 1:
                out.append(part)
            break
        out.append(part)
    return tuple(out)


def _validation_problems(exc: ValidationError, data: object) -> list[ConfigProblem]:
    problems: dict[str, ConfigProblem] = {}
    for err in exc.errors():
        loc = _data_loc(data, tuple(err["loc"]), err["type"])
        problem = _error_problem(err, loc)
        if problem.path in problems:  # one value that failed every branch of a union
            continue
        problems[problem.path] = problem
    return list(problems.values())


# ---- checks across fields -------------------------------------------------------------------


def effective_overlay(config: Config, name: str) -> tuple[dict[str, ArgValue], dict[str, str]]:
    """A profile's flags and environment: engine.args/env overlaid by its `extends` chain and itself."""
    chain: list[Profile] = []
    current: str | None = name
    while current is not None:
        profile = config.profile(current)
        if profile in chain:
            raise ValueError(f"profile {name!r}: 'extends' forms a cycle")
        chain.append(profile)
        current = profile.extends
    args: dict[str, ArgValue] = dict(config.engine.args)
    env: dict[str, str] = dict(config.engine.env)
    for profile in reversed(chain):
        for flag in profile.remove:
            args.pop(flag, None)
        args.update(profile.args)
        for var in profile.env_remove:
            env.pop(var, None)
        env.update(profile.env)
    return args, env


def _fidelity_problems(config: Config) -> list[ConfigProblem]:
    ref = config.fidelity.reference_profile
    if ref is None or ref in config.profile_names:
        return []
    guess = did_you_mean(ref, config.profile_names)
    return [ConfigProblem("fidelity.reference_profile", f"no profile is named {ref!r}",
                          f"did you mean {guess!r}?" if guess else
                          f"use one of: {', '.join(config.profile_names)}")]


def _profile_problems(config: Config) -> list[ConfigProblem]:
    """Long because: it walks every profile once, one check per kind of mistake."""
    problems: list[ConfigProblem] = []
    names = config.profile_names
    seen: set[str] = set()
    for i, p in enumerate(config.profiles):
        if p.name in seen:
            problems.append(ConfigProblem(f"profiles[{i}].name", f"profile name {p.name!r} is used twice",
                                          "give every profile a unique name"))
        seen.add(p.name)
    if problems:
        return problems
    for i, p in enumerate(config.profiles):
        if p.extends is None:
            continue
        if p.extends == p.name:
            problems.append(ConfigProblem(f"profiles[{i}].extends", "a profile cannot extend itself",
                                          "name another profile, or remove 'extends'"))
        elif p.extends not in names:
            guess = did_you_mean(p.extends, names)
            problems.append(ConfigProblem(
                f"profiles[{i}].extends", f"no profile is named {p.extends!r}",
                f"did you mean {guess!r}?" if guess else f"use one of: {', '.join(names)}"))
    if problems:
        return problems
    for i, p in enumerate(config.profiles):
        try:
            effective_overlay(config, p.name)
        except ValueError:
            problems.append(ConfigProblem(
                f"profiles[{i}].extends", f"profile {p.name!r}: 'extends' forms a cycle",
                "break the cycle: one profile of the chain must not extend another"))
    if problems:
        return problems
    for i, p in enumerate(config.profiles):
        if p.extends is None:
            base_args, base_env = dict(config.engine.args), dict(config.engine.env)
            base_name = "engine"
        else:
            base_args, base_env = effective_overlay(config, p.extends)
            base_name = f"profile {p.extends!r}"
        for j, flag in enumerate(p.remove):
            if flag in p.args:
                problems.append(ConfigProblem(
                    f"profiles[{i}].remove[{j}]", f"{flag!r} is both removed and set in this profile's args",
                    "keep one: set it in args to change its value, or remove it"))
            elif flag not in base_args:
                guess = did_you_mean(flag, base_args)
                problems.append(ConfigProblem(
                    f"profiles[{i}].remove[{j}]", f"{flag!r} is not a flag of {base_name}, nothing to remove",
                    f"did you mean {guess!r}?" if guess else
                    f"remove only flags that {base_name} sets: {', '.join(base_args) or '(none)'}"))
        for j, var in enumerate(p.env_remove):
            if var in p.env:
                problems.append(ConfigProblem(
                    f"profiles[{i}].env_remove[{j}]",
                    f"{var!r} is both removed and set in this profile's env",
                    "keep one of them"))
            elif var not in base_env:
                guess = did_you_mean(var, base_env)
                problems.append(ConfigProblem(
                    f"profiles[{i}].env_remove[{j}]",
                    f"{var!r} is not in the environment of {base_name}, nothing to remove",
                    f"did you mean {guess!r}?" if guess else
                    f"remove only variables that {base_name} sets: {', '.join(base_env) or '(none)'}"))
    return problems


def _remediation_problems(config: Config) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    names = config.profile_names
    for key, target in config.remediation.items():
        path = f"remediation.{key}"
        if key not in REMEDIATION_KEYS:
            guess = did_you_mean(key, REMEDIATION_KEYS)
            problems.append(ConfigProblem(
                path, f"{key!r} is not a failure class",
                f"did you mean {guess!r}?" if guess else f"use one of: {', '.join(REMEDIATION_KEYS)}"))
        if target not in names and target not in REMEDIATION_ACTIONS:
            guess = did_you_mean(target, [*names, *REMEDIATION_ACTIONS])
            problems.append(ConfigProblem(
                path, f"{target!r} is neither a profile name nor 'next' or 'stop'",
                f"did you mean {guess!r}?" if guess else
                f"use 'next', 'stop' or one of the profiles: {', '.join(names)}"))
    return problems


def _secret_problems(config: Config) -> list[ConfigProblem]:
    return [*_key_file_problems(config.engine.api_key_file, "engine.api_key_file"),
            *_key_file_problems(config.gateway.api_key_file, "gateway.api_key_file")]


def _key_file_problems(key_file: str | None, path: str) -> list[ConfigProblem]:
    """What the text says; the file itself (mode, owner, existence) is `shell.configfile`'s."""
    if key_file is not None and not key_file.startswith("/"):
        return [ConfigProblem(path, f"{key_file!r} is a relative path (systemd runs us in /)",
                              "write the absolute path of the key file")]
    return []


def is_local_model(model: str) -> bool:
    """A path to weights on this machine, not a Hugging Face id (`org/name`, downloaded by SGLang)."""
    return model.startswith(("/", "./", "../", "~")) or not HF_ID.match(model)


def semantic_problems(config: Config) -> list[ConfigProblem]:
    """Checks that need the whole configuration (the files it names are `shell.configfile`'s)."""
    return [*_profile_problems(config), *_remediation_problems(config), *_secret_problems(config),
            *_fidelity_problems(config)]


# ---- entry points ---------------------------------------------------------------------------


def parse_config(text: str, source: str = "<config>", *,
                 more_checks: Callable[[Config], list[ConfigProblem]] | None = None) -> Config:
    """Validate YAML text; raise ConfigError (only) listing every problem found.

    Pure: the files the configuration names (API key files, a local model) are not looked at
    here; `more_checks` adds such findings to the same report (`shell.configfile.load_config`
    passes its file checks)."""
    data, problems = _read_yaml(text, source)
    if data is None:
        raise ConfigError([ConfigProblem("", "the file is empty",
                                         "start from etc/sglang-supervisor/qwen.yaml")], source)
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem("", f"the top level is a {type(data).__name__}, not a mapping",
                                         "write 'key: value' lines at the top level (engine:, profiles:)")],
                          source)
    raw = _raw_problems(data)
    problems += raw
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        # A raw problem names the exact key; pydantic's error for its mapping would repeat it.
        problems += [p for p in _validation_problems(exc, data)
                     if not any(r.path.startswith(p.path + ".") or r.path.startswith(p.path + "[")
                                for r in raw)]
        _add_lines(problems, text)
        raise ConfigError(problems, source) from None
    except RecursionError:
        raise ConfigError([ConfigProblem("", "an alias refers to itself", "remove the recursive alias")],
                          source) from None
    problems += semantic_problems(config)
    if more_checks is not None:
        problems += more_checks(config)
    if problems:
        _add_lines(problems, text)
        raise ConfigError(problems, source)
    return config


def _add_lines(problems: list[ConfigProblem], text: str) -> None:
    """Append the line of each problem's key ('line 12') when the file has it."""
    index = _line_index(text)
    for i, p in enumerate(problems):
        if not p.path or "line " in p.problem:
            continue
        parts = tuple(x for x in re.split(r"\.|\[(\d+)\]", p.path) if x)
        for n in range(len(parts), 0, -1):
            line = index.get(parts[:n])
            if line is not None:
                problems[i] = ConfigProblem(p.path, f"{p.problem} (line {line})", p.fix)
                break
