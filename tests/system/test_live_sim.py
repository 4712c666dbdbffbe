"""fault_tolerance = "live" through `fatpipe launch` on a real 3-node netns sim cluster: each node's
own torchrun, Lighthouse and relay under its wrapper, gloo over the shaped links. A node whose
agent and workers are killed is started again by its wrapper and rejoins with the live state; a
node whose link is cut for longer than the collective timeout drops out and comes back by itself.
The others take every step without waiting for either. Node 0 destroyed (its Lighthouse with it)
costs the others seconds: node 1's Lighthouse serves; made again and rejoined, node 0's serves
again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import faults
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAME, OCTET = "t-live", 64
STEPS = 150
REPLACED_STEPS = 600  # long enough for a deploy and a rejoin while the others train
TRAIN = ["--preset", "tiny", "--steps", str(STEPS), "--batch-size", "8", "--seq-len", "128",
         "--warmup-steps", "3", "--checkpoint-every", "10", "--comm", "none",
         "--eval-windows", "8", "--fault-tolerance", "live", "--max-restarts", "2"]
RUN_TIMEOUT_S = 400


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from faults.deployed_sim_cluster(tmp_path_factory, NAME, OCTET)


def node_folder(launch, rank: int):
    return launch.run_dir if rank == 0 else launch.run_dir / f"live-node-{rank}"


def node_summary(launch, rank: int) -> dict:
    return json.loads((node_folder(launch, rank) / "summary.json").read_text())


def node_steps(launch, rank: int) -> list[dict]:
    path = node_folder(launch, rank) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kill_node(rank: int) -> None:
    """kill -9 of the node's torchrun agent and workers at once (its wrapper stays)."""
    ns = faults.netns_name(NAME, rank)
    for pid in {*faults.agents(ns), *faults.workers(ns)}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def check_went_on(launch, victim: int) -> None:
    assert launch.finish() == 0, launch.output()
    steps = [r["step"] for r in launch.metrics()]
    assert steps == list(range(1, STEPS + 1)), steps  # node 0 took every step once
    summaries = [node_summary(launch, r) for r in range(3)]
    assert len({s["param_digests"][0] for s in summaries}) == 1, summaries
    events = [m["event"] for m in summaries[0]["membership"]]
    assert "leave" in events and "join" in events, (summaries[0]["membership"],
                                                    launch.node_log(victim)[-3000:])
    leave = next(m for m in summaries[0]["membership"] if m["event"] == "leave")
    assert leave["seconds_lost"] < 10, summaries[0]["membership"]


def test_a_killed_node_is_started_again_and_rejoins_live(needs_netns, cluster):
    launch = faults.Launch(cluster, NAME, TRAIN, RUN_TIMEOUT_S)
    launch.inject(lambda: kill_node(2), 20)
    check_went_on(launch, 2)
    assert "ended by signal KILL, not by fatpipe stop: starting it again" in launch.node_log(2)
    assert "lighthouse: serving on" in launch.node_log(0)
    assert "relay on 127.0.0.1" in launch.node_log(2)


def test_a_node_cut_off_drops_out_and_comes_back_by_itself(needs_netns, cluster):
    launch = faults.Launch(cluster, NAME, TRAIN, RUN_TIMEOUT_S)
    launch.inject(lambda: faults.link_down(faults.netns_name(NAME, 1), 15), 20)
    check_went_on(launch, 1)
    assert "starting it again" not in launch.node_log(1)  # no restart: it rejoined live


def remove_node(rank: int) -> None:
    """The sim's node destroyed: every process in its namespace killed, then the namespace."""
    ns = faults.netns_name(NAME, rank)
    for pid in faults.netns_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["ip", "netns", "del", ns], check=True, timeout=30)


def test_a_destroyed_node_is_left_behind_and_the_others_finish(needs_netns, cluster):
    """Node 0 destroyed, its Lighthouse with it (the next test deploys it again): the others move
    to node 1's Lighthouse and go on within seconds. The launch does not wait for the node out
    of reach once the others ended, ends 0, and names the node that left."""
    launch = faults.Launch(cluster, NAME, TRAIN, RUN_TIMEOUT_S)
    assert launch.inject(lambda: remove_node(0), 20) == 0, launch.output()
    assert [r["step"] for r in node_steps(launch, 1)] == list(range(1, STEPS + 1))
    membership = node_summary(launch, 1)["membership"]
    assert [m["event"] for m in membership] == ["leave"], membership
    assert membership[0]["seconds_lost"] < 10, membership
    assert f"{NAME}-0 left the run" in launch.output(), launch.output()
    assert "the Lighthouse of node 1 at" in launch.node_log(1), launch.node_log(1)[-3000:]


def test_a_replaced_node_rejoins_the_run_it_left(needs_netns, cluster):
    """Node 0, destroyed above, is made again by `fatpipe deploy`; destroyed again mid-run, made
    again while the others train, and started by `fatpipe launch --rejoin`: it joins with the
    live state, its Lighthouse serves again, and it ends with the others' parameters."""
    deployed = faults.fatpipe(cluster, "deploy", NAME)
    assert deployed.returncode == 0, deployed.stdout
    train = [str(REPLACED_STEPS) if arg == str(STEPS) else arg for arg in TRAIN]
    launch = faults.Launch(cluster, NAME, train, RUN_TIMEOUT_S)
    try:
        launch.wait_steps(20)
        remove_node(0)
        faults.wait_for("the step without node 0",
                        lambda: node_steps(launch, 1)[-1]["participants"] == 2, 60)
        deployed = faults.fatpipe(cluster, "deploy", NAME)
        assert deployed.returncode == 0, deployed.stdout
        rejoined = faults.fatpipe(cluster, "launch", NAME, "--rejoin", f"{NAME}-0")
        assert rejoined.returncode == 0, rejoined.stdout
        assert f"{NAME}-0 started again in run" in rejoined.stdout
        assert launch.finish() == 0, launch.output()
    except BaseException:
        launch.stop()
        raise
    events = [m["event"] for m in node_summary(launch, 1)["membership"]]
    assert events == ["leave", "join"], node_summary(launch, 1)["membership"]
    assert "the Lighthouse of node 0 at" in launch.node_log(1).rsplit("node 1 at", 1)[1]
    digests = {node_summary(launch, r)["param_digests"][0] for r in range(3)}
    assert len(digests) == 1, digests
    refused = faults.fatpipe(cluster, "launch", NAME, "--rejoin", f"{NAME}-0")
    assert refused.returncode != 0 and "runs on no other node" in refused.stdout, refused.stdout
