"""What of the nodes' output the terminal shows (ops.run.nodelines): third-party logging left to
the node logs, and under live one line a step for the cluster and each alike line once."""

from __future__ import annotations

from fatpipe.ops.run.nodelines import CLUSTER, WAIT_S, NodeLines

NODES = ["lab-0", "lab-1", "lab-2", "lab-3"]
NOISE = [
    "[W1207 05:14:28.350034559 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3",
    "2026-12-07T05:14:38.405 [INFO] [torchft::lighthouse] - Received quorum request for replica lab-0:28d7",
    "[trainer r0 | torchft.manager] [lab-1:5990/0 - step 0] Unable to reset NCCL flight recorder recording",
    "W1207 05:14:28.350000 123 site-packages/torch/distributed/run.py:793] Setting OMP_NUM_THREADS",
    "lab-0:123:456 [0] NCCL INFO Bootstrap : Using eth0:10.42.0.10<0>",
    "lighthouse: serving on 10.42.0.11:29404 (min replicas 3, heartbeat timeout 3000 ms)",
    "relay: the Lighthouse of node 0 at 10.42.0.10:29401 serves (was node 1's)",
    "/usr/lib/python3/site-packages/torch/nn/modules/module.py:1750: UserWarning: something",
    "  return forward_call(*args, **kwargs)",
]


def step_line(step: int, sync_ms: int, total: int = 20) -> str:
    return (f"step {step}/{total} loss 5.3900 lr 3.00e-05 step 401 ms sync {sync_ms} ms exposed 54 ms "
            "20,446 tok/s wire 3.42/3.42 MB busbw 0.75 tx 0.07 Gbit/s comm none")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines(live: bool, verbose: bool = False, clock=None):
    shown: list[tuple[str, str]] = []
    return shown, NodeLines(lambda n, t: shown.append((n, t)), NODES, live, verbose,
                            **({"clock": clock} if clock else {}))


def test_third_party_logging_stays_in_the_node_logs_and_the_scripts_own_lines_show():
    for live in (False, True):
        shown, feed = lines(live)
        for text in [*NOISE, "iter 10: loss 4.1, time 30 ms", "[trainer r0] data: 2 shards"]:
            feed("lab-1", text)
        feed.flush()
        assert shown == [("lab-1", "iter 10: loss 4.1, time 30 ms"), ("lab-1", "[trainer r0] data: 2 shards")]
    shown, feed = lines(live=True, verbose=True)  # -v: every node's every line
    for node in NODES:
        for text in [*NOISE, step_line(1, 40)]:
            feed(node, text)
    assert len(shown) == len(NODES) * (len(NOISE) + 1)


def test_under_live_a_step_is_one_line_with_the_slowest_sync_and_alike_lines_show_once():
    shown, feed = lines(live=True)
    decision = ["[trainer r0] comm=auto chose none: least lossy hook", "  link 0.961 Gbit/s busbw"]
    for node in NODES:
        for text in decision:
            feed(node, text)
    for step in range(1, 11):
        for i, node in enumerate(reversed(NODES)):  # the nodes' lines in any order
            feed(node, step_line(step, 40 + 10 * i + step))
    for i, node in enumerate(NODES):  # each node's closing line differs: the first one stands
        feed(node, f"[trainer r0] summary: loss {3 + i / 10:.4f}, 20269 tokens/s")
    feed.flush()
    assert shown[-1] == ("lab-0", "[trainer r0] summary: loss 3.0000, 20269 tokens/s")
    shown.pop()
    assert [t for _, t in shown[:2]] == decision and len(shown) == 12
    cluster = shown[2:]
    assert all(label == CLUSTER for label, _ in cluster)
    assert [t.split()[1] for _, t in cluster] == [f"{s}/20" for s in range(1, 11)]
    assert all(f" sync {70 + s} ms " in t and "nodes)" not in t for s, (_, t) in enumerate(cluster, 1))


def test_a_node_that_left_costs_the_cluster_line_one_wait_and_is_named_by_count():
    clock = Clock()
    shown, feed = lines(live=True, clock=clock)
    for node in NODES:
        feed(node, step_line(1, 40))
    for step in (2, 3, 4):  # lab-3 left after step 1
        clock.now += 1
        for node in NODES[:3]:
            feed(node, step_line(step, 40))
    assert [t.split()[1] for _, t in shown] == ["1/20"]  # step 2 waits for lab-3 a while
    clock.now += WAIT_S
    feed("lab-0", step_line(5, 40))
    texts = [t for _, t in shown]
    assert [t.split()[1] for t in texts] == ["1/20", "2/20", "3/20", "4/20"]
    assert texts[1].endswith("(3 of 4 nodes)") and texts[3].endswith("(3 of 4 nodes)")
    for node in NODES[1:3]:  # no wait any more for the node that left
        feed(node, step_line(5, 40))
    assert shown[-1][1].split()[1] == "5/20"
    for node in reversed(NODES):  # it came back: waited for again; a late line adds nothing
        feed(node, step_line(6, 40))
    feed("lab-3", step_line(2, 40))
    feed.flush()
    assert [t.split()[1] for _, t in shown[-2:]] == ["5/20", "6/20"] and "nodes)" not in shown[-1][1]


def test_under_restart_every_line_of_the_main_rank_shows_as_it_is():
    shown, feed = lines(live=False)
    for step in (1, 2):
        feed("lab-0", step_line(step, 40))
    feed("lab-2", "[trainer r2] a warning of rank 2")
    feed("lab-3", "[trainer r3] a warning of rank 2")
    feed.flush()
    assert [n for n, _ in shown] == ["lab-0", "lab-0", "lab-2", "lab-3"]
