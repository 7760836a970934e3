"""deploy/kubernetes/multinode: the LeaderWorkerSet example agrees with the supervisor's config.

kubernetes-validate has no schema for the LeaderWorkerSet CRD, so the checks that matter for a
group are made here: one pod per node, the group restart policy, `restart: external`, the
readiness probe on the leader only, and the embedded configuration valid for every node rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sglang_supervisor.core.config import Config
from sglang_supervisor.core.group import NODE_RANK_ENV, with_node_rank

MANIFEST = (Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "multinode"
            / "leaderworkerset.yaml")


def docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}


def config_for(rank: int) -> Config:
    text = docs()["ConfigMap"]["data"]["config.yaml"].replace("LEADER_ADDRESS", "sglang-big-0.sglang-big")
    config = Config.model_validate(yaml.safe_load(text))
    assert config.group is not None
    group = with_node_rank(config.group, {NODE_RANK_ENV: str(rank)})
    return config.model_copy(update={"group": group})


def test_the_group_matches_the_leaderworkerset() -> None:
    lws = docs()["LeaderWorkerSet"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = config_for(0), config_for(1)
    assert leader.group is not None and worker.group is not None
    assert tmpl["size"] == leader.group.nnodes
    assert leader.group.leader and not worker.group.leader
    assert leader.group.restart == "external"  # LWS recreates the group: exit 76
    gpus = [t["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            for t in (tmpl["leaderTemplate"], tmpl["workerTemplate"])]
    assert int(leader.engine.args["tp-size"]) == sum(gpus)  # type: ignore[arg-type]


def test_probes_on_the_leader_only_and_ports_from_the_config() -> None:
    tmpl = docs()["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    lead = tmpl["leaderTemplate"]["spec"]["containers"][0]
    work = tmpl["workerTemplate"]["spec"]["containers"][0]
    assert lead["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "supervisor"}
    assert not any(k in work for k in ("readinessProbe", "startupProbe", "livenessProbe"))
    config = config_for(0)
    assert config.group is not None
    ports = {p["name"]: p["containerPort"] for p in lead["ports"]}
    assert ports["group-link"] == int(config.group.link.rsplit(":", 1)[1])
    assert ports["dist-init"] == int(config.group.dist_init_addr.rsplit(":", 1)[1])
    assert ports["supervisor"] == int(config.metrics.address.rsplit(":", 1)[1])
    for c in (lead, work):
        script = c["args"][0]
        assert "$LWS_LEADER_ADDRESS" in script and f'export {NODE_RANK_ENV}="$LWS_WORKER_INDEX"' in script


def test_both_pods_mount_the_group_secret_owner_only() -> None:
    tmpl = docs()["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    config = config_for(0)
    assert config.group is not None and config.group.secret_file is not None
    directory, name = config.group.secret_file.rsplit("/", 1)
    for role in ("leaderTemplate", "workerTemplate"):
        spec = tmpl[role]["spec"]
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert mounts["group-secret"]["mountPath"] == directory and mounts["group-secret"]["readOnly"]
        secret = volumes["group-secret"]["secret"]
        assert secret["defaultMode"] == 0o400, role  # 0400: the supervisor refuses more
        assert f"--from-file={name}=" in MANIFEST.read_text()  # the comment says how to create it
