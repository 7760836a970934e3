"""What the supervisor's parts share and what changes under them: the configuration being served
(a reload swaps it, a rollback puts the old one back), its fingerprint, and what start-up opens
(the HTTP client, the loop). The Supervisor owns one `Current` and hands it to each part that
reads these, so a part's constructor says what it depends on instead of reaching through the
whole Supervisor.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from sglang_supervisor.core.config import Config
from sglang_supervisor.shell.engineproc import ports
from sglang_supervisor.shell.engineproc.preflight import Prepared


@dataclass
class Current:
    prep: Prepared
    fp: str
    client: httpx.AsyncClient | None = None  # opened by Supervisor.run
    loop: asyncio.AbstractEventLoop | None = None  # the loop Supervisor.run runs on

    @property
    def config(self) -> Config:
        return self.prep.config

    @property
    def base_url(self) -> str:
        return ports.local_base_url(self.config.engine.host, self.config.engine.port)

    def running_loop(self) -> asyncio.AbstractEventLoop:
        assert self.loop is not None, "the supervisor's loop runs only inside run()"
        return self.loop
