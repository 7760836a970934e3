"""Scenario systemd, s8_systemd: the shipped unit, hardening unchanged, under a carried real
systemd (scripts/gpu/systemd-unit.sh; GPU machine only)."""

from __future__ import annotations

import os
import subprocess

import seedshape
import yaml

from .adapters import free_port
from .common import GPU_SCRIPTS, ROOT, check
from .context import Context
from .seed import seed_drop, seed_model


def s8_systemd(ctx: Context) -> None:
    if not ctx.real or not list((ROOT / ".sd").glob("systemd_*.deb")):
        ctx.skip("s8_systemd", "needs the GPU machine and Debian 12's systemd packages in .sd/")
        return
    if ctx.left() < 200:
        ctx.skip("s8_systemd", f"budget: {ctx.left():.0f} s left, 200 s needed")
        return
    model, _ = seed_model(ctx)
    cfg = seedshape.unit_config(python=ctx.o.engine_python, model=model, metrics_port=free_port(),
                                drop=seed_drop(ctx))
    path = ctx.work / "seed-unit.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = dict(os.environ, CONFIG=str(path), MODEL=model, OUT=str(ctx.out),
               WAIT_S=str(int(max(60, ctx.left() - 90))), RESTART=str(int(ctx.o.systemd_restart)))
    try:
        r = subprocess.run(["bash", str(GPU_SCRIPTS / "systemd-unit.sh")], env=env,
                           capture_output=True, text=True, timeout=max(30, ctx.left() - 10), check=False)
        rc: int | str = r.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    text = (ctx.out / "systemd.txt").read_text(errors="replace") if (ctx.out / "systemd.txt").exists() else ""
    checks = [check(line[5:], line.startswith("PASS"), None)
              for line in text.splitlines() if line.startswith(("PASS ", "FAIL "))]
    checks.append(check("systemd-unit.sh exit 0", rc == 0, rc))
    ctx.record("s8_systemd", checks, {"transcript_tail": text[-3000:]})
