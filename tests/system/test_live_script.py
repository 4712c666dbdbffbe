"""A user's DDP script under fault_tolerance = "live", through fatpipe.trainer.api's four lines: three
loopback nodes (each its own torchrun, one replica group), a Lighthouse, gloo between them. Each
node initialises its model from a seed of its own: the first quorum gives every node one node's
weights. One node killed mid-run (agent and workers) costs the others seconds; started again, it
is sent the live model, optimizer and scheduler, loops on the run's committed steps, and ends
with the others' parameters. The script takes its optimizer and data shard before wrap().
"""

from __future__ import annotations

import time

import lighthouses
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

STEPS = 150
RUN_S = 300

SCRIPT = '''
import os
import time

import torch
import torch.distributed as dist

import fatpipe.trainer.api as fatpipe

STEPS = int(os.environ["LIVE_SCRIPT_STEPS"])
dist.init_process_group("gloo")
torch.manual_seed(1000 + int(os.environ["FATPIPE_NODE_RANK"]))  # every node its own init
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
adamw = torch.optim.AdamW(net.parameters(), lr=1e-3)
schedule = torch.optim.lr_scheduler.LambdaLR(adamw, lambda step: min(1.0, (step + 1) / 10))
# The optimizer and the shard before wrap(), as nanoGPT orders its set-up: any order works.
optimizer = fatpipe.optimizer(adamw, schedule)
shard, shards = fatpipe.data_shard()
with open(os.environ["LIVE_SCRIPT_HOLD"] + f".shard-{shard}-of-{shards}", "w"):
    pass
model = fatpipe.wrap(net)
while fatpipe.steps_done() < STEPS:
    g = torch.Generator().manual_seed(fatpipe.steps_done() * shards + shard)
    x = torch.randn(32, 64, generator=g)
    loss = (model(x) - x.flip(1)).pow(2).mean()
    loss.backward()
    if optimizer.step():
        schedule.step()
    optimizer.zero_grad()
    fatpipe.step(loss, tokens=x.shape[0], lr=schedule.get_last_lr()[0])
    # Slow steps while the test holds the run, so that the killed node is back before its end.
    time.sleep(0.3 if os.path.exists(os.environ["LIVE_SCRIPT_HOLD"]) else 0.02)
'''


@pytest.fixture(autouse=True)
def cleanup():
    yield
    lighthouses.stop_all()


def test_a_scripts_node_killed_and_started_again_rejoins_with_the_live_state(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("LIVE_SCRIPT_STEPS", str(STEPS))
    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv("LIVE_SCRIPT_HOLD", str(hold))
    _lh, port = lighthouses.start_lighthouse(tmp_path / "lighthouse.log")
    nodes = [lighthouses.LiveNode(tmp_path, r, 3, port, ["--steps", str(STEPS)], script=script)
             for r in range(3)]
    for node in nodes:
        node.start()
    victim = nodes[2]
    victim.wait_step(15, RUN_S)
    killed_step, killed_at = victim.last_step(), victim.kill()
    nodes[0].wait_step(killed_step + 3, 60)
    after = [r for r in nodes[0].metrics() if r["time"] > killed_at]
    assert after[0]["time"] - killed_at < 10, after[:3]
    assert after[1]["participants"] == 2, after[:3]
    victim.start()  # no checkpoint of the script's own: the peers send the live state
    deadline = time.monotonic() + RUN_S
    while not any(r["healed"] and r["step"] > killed_step for r in victim.metrics()):
        assert time.monotonic() < deadline and victim.proc.poll() is None, victim.log.read_text()[-4000:]
        time.sleep(0.3)
    hold.unlink()
    for node in nodes:
        assert node.wait(RUN_S) == 0, node.log.read_text()[-4000:]
    summaries = [n.summary() for n in nodes]
    assert len({s["param_digest"] for s in summaries}) == 1, [n.log.read_text()[-3000:] for n in nodes]
    assert [r["step"] for r in nodes[0].metrics()] == list(range(1, STEPS + 1))
    events = [m["event"] for m in summaries[0]["membership"]]
    assert events == ["leave", "join"], summaries[0]["membership"]
    assert summaries[0]["fault_tolerance"] == "live" and summaries[0]["uncommitted_steps"] <= 3
    shards = sorted(p.name.rsplit(".", 1)[1] for p in tmp_path.glob("hold.shard-*"))
    assert shards == ["shard-0-of-3", "shard-1-of-3", "shard-2-of-3"], shards  # nodes read apart
    rejoined = nodes[2].metrics()
    assert rejoined[-1]["step"] == STEPS and any(r["healed"] for r in rejoined), rejoined[-5:]
    # The scheduler came with the state: the learning rate it recorded is the run's.
    assert rejoined[-1]["lr"] == nodes[0].metrics()[-1]["lr"]
