"""The configuration file and the files it names, read and checked: the I/O half of `core.config`.

`load_config(path)` is the entry point of every command: it reads the file (bounded), validates
the text (`core.config.parse_config`, pure) and adds what only the filesystem can say: the
configuration, state or key files another user could write (`shell.files.filetrust`), an API key file
readable by every user or not by us, a local model path that does not exist. Exposure (a metrics
or engine address off loopback) is a warning (`core.exposure`).
`parse_checked(text)` is the same for text already read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path

import structlog

from sglang_supervisor.core.config import (
    MAX_CONFIG_BYTES,
    Config,
    ConfigError,
    ConfigProblem,
    is_local_model,
    parse_config,
)
from sglang_supervisor.core.exposure import exposure_warnings
from sglang_supervisor.engine.migrate import stdout_log_handlers
from sglang_supervisor.shell.files.filetrust import untrusted_config_file, untrusted_files

log = structlog.get_logger("sglang_supervisor.core.config")


def key_file_problems(key_file: str | None, path: str) -> list[ConfigProblem]:
    """The key file must be a regular file we can read and others cannot (a relative path is
    refused by `core.config` already)."""
    if key_file is None or not os.path.isabs(key_file):
        return []
    try:
        st = os.stat(key_file)
    except OSError as exc:
        return [ConfigProblem(path, f"cannot read {key_file}: {exc.strerror}",
                              "create the file holding only the API key (chmod 600), or fix the path")]
    if not stat.S_ISREG(st.st_mode):
        return [ConfigProblem(path, f"{key_file} is not a regular file",
                              "point it at the file holding the key")]
    if st.st_mode & stat.S_IROTH:
        mode = stat.S_IMODE(st.st_mode)
        return [ConfigProblem(path, f"{key_file} is readable by every user (mode {mode:04o})",
                              f"chmod 600 {key_file} (or 640 with a dedicated group)")]
    if not os.access(key_file, os.R_OK):
        return [ConfigProblem(path, f"{key_file} is not readable by this user (uid {os.getuid()})",
                              f"chown the file to the service user, or run as its owner: ls -l {key_file}")]
    return []


def model_path_problems(model: str) -> list[ConfigProblem]:
    """A local model must exist where the supervisor's user looks (else every profile would fail
    to load it and be remembered as bad). A Hugging Face id (`org/name`) is downloaded by SGLang."""
    path = "engine.model_path"
    if not is_local_model(model) or os.path.exists(os.path.expanduser(model)):
        return []
    if not os.path.isabs(os.path.expanduser(model)) and not model.startswith(("./", "../", "~")):
        return [ConfigProblem(path, f"{model!r} is neither a local path nor a Hugging Face id",
                              "write the absolute path of the weights directory, or a Hugging Face "
                              "id such as Qwen/Qwen3-8B")]
    try:
        os.stat(os.path.expanduser(model))
        why = "cannot be read"
    except FileNotFoundError:
        why = "does not exist"
    except PermissionError:
        why = "cannot be reached by this user (permission denied)"
    except OSError as exc:
        why = f"cannot be read ({exc.strerror})"
    return [ConfigProblem(path, f"{model} {why}",
                          "download the weights there or fix the path (a Hugging Face id such as "
                          "Qwen/Qwen3-8B is downloaded instead)")]


def file_problems(config: Config) -> list[ConfigProblem]:
    """What the filesystem says about the files a valid configuration names."""
    return [*untrusted_files(config),
            *key_file_problems(config.engine.api_key_file, "engine.api_key_file"),
            *key_file_problems(config.gateway.api_key_file, "gateway.api_key_file"),
            *model_path_problems(config.engine.model_path)]


def parse_checked(text: str, source: str = "<config>") -> Config:
    """`core.config.parse_config` plus the file checks, in one report."""
    return parse_config(text, source, more_checks=file_problems)


def load_config(path: str | Path, *, on_warning: Callable[[ConfigProblem], None] | None = None) -> Config:
    """Read and validate a configuration file. Warnings go to `on_warning` (default: the log)."""
    source = str(path)
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # a device or a huge file is not read whole
    except OSError as exc:
        raise ConfigError([ConfigProblem("", f"cannot read {source}: {exc.strerror}",
                                         "pass an existing file with --config, e.g. "
                                         "/etc/sglang-supervisor/qwen.yaml")],
                          source) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigProblem("", f"{source} is not UTF-8 text (byte {exc.start})",
                                         "save the file as UTF-8")], source) from None
    config = parse_config(text, source, more_checks=lambda c: [
        *untrusted_config_file(source, c.state_dir), *file_problems(c)])
    for warning in exposure_warnings(config):
        if on_warning is None:
            log.warning("config.warning", path=warning.path or source, problem=warning.problem,
                        fix=warning.fix)
        else:
            on_warning(warning)
    return config


def default_demo_config_path() -> Path:
    """The packaged demo configuration (the simulator engine), also at etc/sglang-supervisor/demo.yaml."""
    return Path(str(resources.files("sglang_supervisor.defaults").joinpath("demo.yaml")))


LOGGING_CONFIG_ENV = "SGLANG_LOGGING_CONFIG_PATH"
MAX_LOGGING_CONFIG_BYTES = 1 << 20


def _read_small_regular(path: str) -> str | None:
    """The text of a regular file of at most MAX_LOGGING_CONFIG_BYTES, else None (never blocks
    on a FIFO or a device)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_LOGGING_CONFIG_BYTES + 1)
        if len(raw) > MAX_LOGGING_CONFIG_BYTES:
            return None
        return raw.decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def logging_config_problems(envs: Mapping[str, Mapping[str, str]], inherited: Mapping[str, str]
                            ) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(errors, warnings) for `SGLANG_LOGGING_CONFIG_PATH` as `run` starts: a file whose handlers
    write to stdout is refused (the supervisor reads SGLang's log from stderr only, so no start
    would ever be seen: docs/FAULTS.md); a file it cannot read is warned about. `envs`: each
    profile's rendered environment; `inherited`: the supervisor's own, which the engine gets."""
    errors: list[ConfigProblem] = []
    warnings: list[ConfigProblem] = []
    seen: dict[str, list[str] | None] = {}
    fix = (f"send every handler of that file to ext://sys.stderr, or remove {LOGGING_CONFIG_ENV}; "
           "sglang-supervisor check --config FILE lists it")
    for profile, env in envs.items():
        path = env.get(LOGGING_CONFIG_ENV, inherited.get(LOGGING_CONFIG_ENV))
        if not path:
            continue
        key = (f"profiles.{profile}.env.{LOGGING_CONFIG_ENV}" if LOGGING_CONFIG_ENV in env
               else f"{LOGGING_CONFIG_ENV} (the supervisor's environment)")
        if path not in seen:
            text = _read_small_regular(path)
            seen[path] = None if text is None else stdout_log_handlers(text)
        handlers = seen[path]
        if handlers is None:
            warnings.append(ConfigProblem(
                key, f"cannot check {path} (not a readable JSON file of at most "
                     f"{MAX_LOGGING_CONFIG_BYTES} bytes): if SGLang's log goes to stdout the "
                     "supervisor cannot see the engine start", fix))
        elif handlers:
            errors.append(ConfigProblem(
                key, f"{path} sends SGLang's log to stdout (handler(s) {', '.join(handlers)}); "
                     "the supervisor reads SGLang's log from stderr only", fix))
    return errors, warnings
