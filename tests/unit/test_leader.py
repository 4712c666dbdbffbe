"""Node index and torch's group rank: the plan matches what c10d does, the nodes' records win, and
every reader of what rank 0 wrote goes to the node that ran it (docs/ARCHITECTURE.md, "Rendezvous")."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from fatpipe.cli.pull import pick_nodes
from fatpipe.infra.defaults import GROUP_RANK_FILE
from fatpipe.node.env import GROUP_RANK_FILE as GROUP_RANK_FILE_ENV
from fatpipe.ops.rdzv.nodefiles import node_script_text, planned_group_ranks
from fatpipe.ops.rdzv.noderun import NodeRun
from fatpipe.ops.rdzv.rendezvous import NodePlan, Rendezvous
from fatpipe.ops.reach.transport import LocalTransport
from fatpipe.ops.run.leader import leader, leader_first, leader_index
from fatpipe.ops.run.progress import leader_progress
from fatpipe.ops.run.pullpaths import NodeSource
from fatpipe.trainer.noderank import record_group_rank

pytestmark = pytest.mark.timeout(120)

# Sorted as strings these are not in numeric order: 10.0.0.100 < 10.0.0.25 < 10.0.0.9.
ADDRESSES = [
    ["10.0.0.9", "10.0.0.100", "10.0.0.25"],
    ["10.0.0.2", "10.0.0.10"],
    ["10.0.0.10", "10.0.0.11", "10.0.0.12"],
    ["10.0.1.5", "10.0.0.200", "10.0.10.1", "10.0.2.3"],
    ["192.168.1.9"],
]


def rendezvous(ips: list[str], workdirs: list[Path] | None = None, max_restarts: int = 2) -> Rendezvous:
    nodes = [NodePlan(rank=i, name=f"n-{i}", transport="local", private_ip=ip, public_ip=None, netns=None,
                      workdir=str(workdirs[i]) if workdirs else "/nowhere", python="true")
             for i, ip in enumerate(ips)]
    return Rendezvous(run_id="r1", cluster="c", provider="ssh", nnodes=len(ips), nproc_per_node=1,
                      rdzv_backend="c10d", rdzv_endpoint=f"{ips[0]}:1", max_restarts=max_restarts,
                      join_timeout_s=10, run_rel="runs/r1", entry=["job.py"], builtin_trainer=False,
                      tier_gbps=1, created="", nodes=nodes)


def torch_group_ranks(addresses: list[str]) -> list[int]:
    """The group rank torch's own c10d rendezvous hands each node, joined on loopback addresses."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got: dict[int, int] = {}
    everyone = threading.Barrier(len(addresses))

    def join(i: int) -> None:
        handler = get_rendezvous_handler(RendezvousParameters(
            backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="order", min_nodes=len(addresses),
            max_nodes=len(addresses), local_addr=addresses[i], is_host=i == 0, join_timeout=60, read_timeout=60))
        got[i] = handler.next_rendezvous().rank
        everyone.wait(60)  # a shutdown closes the rendezvous: not before every node has its rank
        handler.shutdown()

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(len(addresses))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(got) == len(addresses), "the rendezvous did not complete"
    return [got[i] for i in range(len(addresses))]


@pytest.mark.parametrize("ips", [["127.0.0.9", "127.0.0.100", "127.0.0.25"], ["127.0.0.2", "127.0.0.10"],
                                 ["127.0.1.5", "127.0.0.200", "127.0.10.1", "127.0.2.3"]])
def test_the_plan_is_what_torchs_c10d_rendezvous_does(ips):
    assert torch_group_ranks(ips) == planned_group_ranks(ips)


def test_planned_ranks_sort_addresses_as_strings():
    assert planned_group_ranks(ADDRESSES[0]) == [2, 0, 1]
    assert planned_group_ranks(ADDRESSES[1]) == [1, 0]
    assert planned_group_ranks(ADDRESSES[2]) == [0, 1, 2]
    assert planned_group_ranks(ADDRESSES[3]) == [1, 0, 2, 3]
    for ips in ADDRESSES:
        assert sorted(planned_group_ranks(ips)) == list(range(len(ips)))


@pytest.mark.parametrize("ips", ADDRESSES)
def test_the_leader_is_the_planned_rank_0_until_the_nodes_record_theirs(tmp_path, ips):
    rdzv = rendezvous(ips)
    planned = planned_group_ranks(ips).index(0)
    assert leader_index(rdzv, tmp_path) == planned
    # torch ranked otherwise than planned: the node that recorded 0 is the leader.
    other = (planned + 1) % len(ips)
    (tmp_path / GROUP_RANK_FILE.format(index=other)).write_text("0\n")
    assert leader_index(rdzv, tmp_path) == other
    (tmp_path / GROUP_RANK_FILE.format(index=other)).write_text("garbage")
    assert leader_index(rdzv, tmp_path) == planned


def test_leader_first_keeps_every_node_once(tmp_path):
    rdzv = rendezvous(ADDRESSES[0])
    nodes = [NodeRun(rdzv, plan, LocalTransport(plan.name)) for plan in rdzv.nodes]
    assert [n.name for n in leader_first(nodes, tmp_path)] == ["n-1", "n-0", "n-2"]
    assert leader(nodes, tmp_path).name == "n-1"


def test_only_local_rank_0_records_and_the_record_is_whole(tmp_path):
    path = tmp_path / "node-3.group-rank"
    record_group_rank({GROUP_RANK_FILE_ENV: str(path), "GROUP_RANK": "2", "LOCAL_RANK": "1"})
    assert not path.exists()
    record_group_rank({GROUP_RANK_FILE_ENV: str(path), "GROUP_RANK": "2", "LOCAL_RANK": "0"})
    assert path.read_text() == "2\n" and list(tmp_path.iterdir()) == [path]
    record_group_rank({"GROUP_RANK": "0", "LOCAL_RANK": "0"})  # plain torchrun: nothing to write to
    record_group_rank({GROUP_RANK_FILE_ENV: str(tmp_path / "gone" / "x"), "GROUP_RANK": "0"})  # never raises
    assert path.read_text() == "2\n"


def test_the_node_script_names_and_clears_the_record(tmp_path):
    rdzv = rendezvous(ADDRESSES[1])
    text = node_script_text(rdzv, rdzv.nodes[1])
    assert f'rm -f runs/r1/node-1.group-rank; export {GROUP_RANK_FILE_ENV}="$PWD"/runs/r1/node-1.group-rank' in text


def test_status_reads_the_node_that_recorded_rank_0(tmp_path):
    """The planned leader recorded another rank: the others are asked, and the one that recorded 0 answers."""
    workdirs = [tmp_path / f"node-{i}" for i in range(3)]
    rdzv = rendezvous(ADDRESSES[0], workdirs)
    nodes = [NodeRun(rdzv, plan, LocalTransport(plan.name)) for plan in rdzv.nodes]
    for i, folder in enumerate(workdirs):
        (folder / "runs/r1").mkdir(parents=True)
        (folder / "runs/r1" / GROUP_RANK_FILE.format(index=i)).write_text(f"{(i + 2) % 3}\n")  # node 1 is 0
    (workdirs[1] / "runs/r1/metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 3.0}) + "\n")
    node, found = leader_progress(nodes, nodes[0])
    assert node.name == "n-1" and found["last_step"] == 5 and found["group_rank"] == 0
    node, found = leader_progress(nodes, nodes[1])  # the plan was right: one read
    assert node.name == "n-1" and found["last_step"] == 5


def test_fatpipe_pull_defaults_to_the_leader():
    sources = [NodeSource(f"n-{i}", None, "/x") for i in range(3)]
    assert [s.name for s in pick_nodes(sources, (), False, "c", "n-2")] == ["n-2"]
    assert [s.name for s in pick_nodes(sources, (), False, "c", None)] == ["n-0"]
    assert [s.name for s in pick_nodes(sources, (), False, "c", "n-9")] == ["n-0"]  # not a node now


def run_wrapper(rdzv: Rendezvous, index: int, body: str, timeout_s: float = 30) -> tuple[str, str]:
    """The node's real wrapper around a stand-in node script; returns (status, log)."""
    folder = Path(rdzv.nodes[index].workdir)
    (folder / rdzv.run_rel).mkdir(parents=True, exist_ok=True)
    (folder / rdzv.run_rel / f"node-{index}.sh").write_text(
        'n=$(( $(cat attempts.txt 2>/dev/null || echo 0) + 1 )); echo $n > attempts.txt\n' + body)
    node = NodeRun(rdzv, rdzv.nodes[index], LocalTransport(rdzv.nodes[index].name))
    assert node.transport.run(node.start_command()).ok
    deadline = time.monotonic() + timeout_s
    while (state := node.status()) in ("running", "not-started") and time.monotonic() < deadline:
        time.sleep(0.1)
    return state, (folder / rdzv.run_rel / f"node-{index}.log").read_text()


def test_the_node_of_group_rank_0_is_not_restarted_after_a_signal(tmp_path):
    # Its agent hosted the store the workers share: a new torchrun there would leave the other
    # agents sending their workers to the old one. Another node still is restarted.
    workdirs = [tmp_path / f"node-{i}" for i in range(2)]
    rdzv = rendezvous(ADDRESSES[1], workdirs)  # node 1 (10.0.0.10) is group rank 0
    state, log = run_wrapper(rdzv, 1, "echo 0 > runs/r1/node-1.group-rank; kill -KILL $$\n")
    assert state == "137" and "starting it again" not in log, log
    rdzv = rendezvous(ADDRESSES[0], [tmp_path / f"other-{i}" for i in range(3)])  # node 2 is group rank 1
    state, log = run_wrapper(rdzv, 2, 'if [ $n = 1 ]; then echo 1 > runs/r1/node-2.group-rank; kill -KILL $$; fi\n')
    assert state == "0" and "starting it again (restart 1 of 2)" in log, log
