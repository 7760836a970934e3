"""sglang-sim's multi-node launch: rank split, flag checks, the dist-init rendezvous."""

from __future__ import annotations

import socket
import threading

import pytest

from sglang_supervisor.simulator import multinode
from sglang_supervisor.simulator.args import SimArgsError, load_config

BASE = ["--model-path", "Qwen/Qwen3-0.6B", "--tp-size", "4"]


def test_ranks_are_split_evenly_and_stay_global() -> None:
    assert list(multinode.local_ranks(4, 2, 0)) == [0, 1]
    assert list(multinode.local_ranks(4, 2, 1)) == [2, 3]
    assert list(multinode.local_ranks(8, 4, 3)) == [6, 7]


def test_multinode_flags_resolve() -> None:
    cfg = load_config([*BASE, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000",
                       "--dist-timeout", "30"], {})
    assert (cfg.nnodes, cfg.node_rank, cfg.dist_init_addr, cfg.dist_timeout) == (2, 1, "10.0.0.1:5000", 30)


@pytest.mark.parametrize(("extra", "needle"), [
    (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"], "--node-rank 2 must be in 0..1"),
    (["--nnodes", "3", "--dist-init-addr", "h:1"], "multiple of --nnodes 3"),
    (["--nnodes", "2"], "needs --dist-init-addr"),
])
def test_bad_multinode_flags_name_the_fix(extra: list[str], needle: str) -> None:
    with pytest.raises(SimArgsError, match=needle):
        load_config([*BASE, *extra], {})


def test_dist_init_addr_shapes() -> None:
    assert multinode.parse_dist_init_addr("127.0.0.1:29500") == ("127.0.0.1", 29500)
    assert multinode.parse_dist_init_addr("[::1]:29500") == ("::1", 29500)
    with pytest.raises(multinode.RendezvousError, match="HOST:PORT"):
        multinode.parse_dist_init_addr("127.0.0.1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rendezvous_waits_for_every_node() -> None:
    port = _free_port()
    joined: list[socket.socket] = []

    def worker() -> None:
        joined.append(multinode.worker_rendezvous("127.0.0.1", port, 1, 20.0))

    t = threading.Thread(target=worker)
    t.start()
    peers = multinode.leader_rendezvous("127.0.0.1", port, 2, 20.0)
    t.join(20)
    assert len(peers) == 1 and len(joined) == 1
    lost = threading.Event()
    multinode.watch_peers(peers, lost.set)
    joined[0].close()  # the worker node's rank died: the leader's collectives break
    assert lost.wait(20)
    peers[0].close()


def test_a_missing_node_ends_in_the_store_timeout() -> None:
    msg = r"Timed out after \d+ seconds waiting for clients. 1/2"
    with pytest.raises(multinode.RendezvousError, match=msg):
        multinode.leader_rendezvous("127.0.0.1", _free_port(), 2, 0.3)


def test_a_stray_client_is_not_a_node() -> None:
    port = _free_port()
    result: list[list[socket.socket]] = []
    t = threading.Thread(
        target=lambda: result.append(multinode.leader_rendezvous("127.0.0.1", port, 2, 20.0)))
    t.start()
    stray = None
    for _ in range(200):
        try:
            stray = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            threading.Event().wait(0.05)
    assert stray is not None
    stray.sendall(b"GET / HTTP/1.1\r\n\r\n")
    conn = multinode.worker_rendezvous("127.0.0.1", port, 1, 20.0)
    t.join(20)
    assert len(result[0]) == 1
    conn.close()
    stray.close()
    result[0][0].close()
