"""A `Lifecycle` driven by hand in unit tests: inputs fed on a fake clock, every answer kept.

`tests` is not a package: tests import this as `from lifecycle_driver import LifecycleDriver`
(see conftest.py).
"""

from __future__ import annotations

from sglang_supervisor.core.actions import Action, Launch
from sglang_supervisor.core.inputs import Launched, Settings
from sglang_supervisor.core.lifecycle import Lifecycle


class LifecycleDriver:
    """Feeds inputs with a fake clock (each input `dt` after the one before) and remembers every
    action in `log`."""

    def __init__(self, settings: Settings) -> None:
        self.lc = Lifecycle(settings)
        self.now = 0.0
        self.log: list[Action] = []

    def feed(self, *inputs: object, dt: float = 1.0) -> list[Action]:
        out: list[Action] = []
        for inp in inputs:
            self.now += dt
            out += self.lc.handle(inp, self.now)  # type: ignore[arg-type]
        self.log += out
        return out

    def answer_launch(self, acts: list[Action], expected: frozenset[tuple[str, str, str]]) -> Launch:
        """The last `Launch` in `acts`, answered as spawned (pid 100 + attempt) with the captures
        `expected` of it."""
        launch = [a for a in acts if isinstance(a, Launch)][-1]
        self.feed(Launched(launch.attempt, 100 + launch.attempt, expected))
        return launch
