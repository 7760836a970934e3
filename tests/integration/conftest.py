"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from supervised import Daemon


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Every supervisor a test starts; each is stopped and its engines reaped when the test ends."""
    started: list[Daemon] = []
    yield started
    for d in started:
        d.close()
