"""Reading the configuration the way the one-shot commands that only read it do (`forget`,
`upgrade`): warnings dropped, problems printed under the --config name, exit 78."""

from __future__ import annotations

import sys

from sglang_supervisor.core.config import Config, ConfigError
from sglang_supervisor.shell.files.configfile import load_config


def load_or_report(source: str) -> Config | None:
    """The configuration at `source`, or None once its problems are on stderr (exit CONFIG)."""
    try:
        return load_config(source, on_warning=lambda w: None)
    except ConfigError as exc:
        print(ConfigError(exc.problems, source).report(), file=sys.stderr)
        return None
