"""`python -m sglang_supervisor.simulator`: same as the `sglang-sim` console script."""

from __future__ import annotations

import sys

from sglang_supervisor.simulator.cli import main

if __name__ == "__main__":
    sys.exit(main())
