"""The public API for a user's DDP script (fatpipe.trainer.api): finding the run, wrapping, recording.

The recording test runs in a child process that ends with os._exit, as the trainer does: gloo's
threads outlive a destroyed process group (tests/unit/test_autocomm.py says why).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import torch

from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runs import new_run
from fatpipe.infra.trainspec import TrainSpec
from fatpipe.ops.rdzv.rendezvous import new_rendezvous
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.summary import run_summary
from fatpipe.trainer import api


def test_outside_a_run_there_is_no_config_and_no_group_leaves_the_model_alone():
    assert api.run_config(environ={}) is None
    model = torch.nn.Linear(2, 2)
    assert api.wrap(model) is model  # no process group: one process, nothing to synchronise
    assert api.step(torch.tensor(1.0), tokens=4) is None and api.run_dir() is None
    # The live API's calls outside a run: the optimizer steps every time and says so (the
    # documented `if optimizer.step(): scheduler.step()` steps the schedule), one shard, steps
    # still counted (a loop on steps_done() ends under plain torchrun too).
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = api.optimizer(sgd)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # an Optimizer
    before_weight = model.weight.detach().clone()
    model(torch.ones(1, 2)).sum().backward()
    if optimizer.step():
        schedule.step()
    assert not torch.equal(model.weight, before_weight) and sgd.param_groups[0]["lr"] == 0.05
    optimizer.zero_grad()
    assert model.weight.grad is None and optimizer.state_dict() == sgd.state_dict()
    assert api.data_shard() == (0, 1)
    before = api.steps_done()
    api.step(torch.tensor(1.0), tokens=4)
    assert api.steps_done() == before + 1



def test_inside_a_run_each_call_works_in_any_order_or_names_the_order(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "_wrapped", False)
    monkeypatch.setenv(api.RUN_DIR_ENV, str(tmp_path / "run"))
    monkeypatch.setenv(api.TRAIN_ARGS_ENV, "--fault-tolerance restart")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert api.data_shard() == (3, 4)  # before the script's init_process_group: torchrun's
    with pytest.raises(RuntimeError, match=r"call fatpipe.wrap\(model\) before the first step"):
        api.step(torch.tensor(1.0), tokens=4)
    with pytest.raises(RuntimeError, match="needs the process group"):
        api.wrap(torch.nn.Linear(2, 2))
    # Under live each node's torchrun numbers its ranks from 0: the shard is the node's, also
    # before wrap() (nanoGPT seeds its data before it builds the model).
    monkeypatch.setenv(api.TRAIN_ARGS_ENV, "--fault-tolerance live")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("FATPIPE_LIVE_LIGHTHOUSE", "10.0.0.1:29510")
    monkeypatch.setenv("FATPIPE_PRIVATE_IP", "10.0.0.3")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("FATPIPE_NODE_RANK", "2")
    monkeypatch.setenv("FATPIPE_NODES", "3")
    assert api.data_shard() == (5, 6)


def test_the_run_config_comes_from_the_node_environment(tmp_path):
    args = TrainSpec(comm="bf16", powersgd_rank=2, data=str(tmp_path / "absent.txt")).trainer_args()
    environ = {api.RUN_DIR_ENV: "runs/r1", api.TRAIN_ARGS_ENV: shlex.join(args)}
    cfg = api.run_config(environ=environ)
    assert cfg.comm == "bf16" and cfg.powersgd_rank == 2 and cfg.out == "runs/r1"
    assert cfg.data is None  # the built-in trainer's corpus is not the script's
    cfg = api.run_config(steps=7, comm="none", environ=environ)
    assert cfg.steps == 7 and cfg.comm == "none"
    assert api.run_config(run_dir=tmp_path, environ={}).out == str(tmp_path)  # defaults: comm auto


def test_a_script_run_tells_every_node_where_its_run_is(project_dir):
    project = load_project()
    outputs = parse_outputs({
        "name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
        "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local"}
                  for i in range(2)]})
    (project_dir / "train.py").write_text("print('hi')\n")
    run_id, run_dir = new_run(project, "demo")
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir, train=TrainSpec(comm="fp16"),
                           script=["train.py", "--steps", "3"])
    for node in rdzv.nodes:
        assert node.env[api.RUN_DIR_ENV] == rdzv.run_rel
        environ = {k: v for k, v in node.env.items() if k.startswith("FATPIPE_")}
        assert api.run_config(environ=environ).comm == "fp16"
    env_text = (run_dir / "node-1.env").read_text()
    assert f"{api.RUN_DIR_ENV}={rdzv.run_rel}" in env_text and "--comm fp16" in env_text


def test_ssh_nodes_running_a_script_can_import_the_api(project_dir):
    project = load_project()
    outputs = parse_outputs({
        "name": "demo", "provider": "aws", "region": "us-east-1", "tier_gbps": 10,
        "private_cidr": "10.42.0.0/24", "ssh_user": "ubuntu",
        "nodes": [{"name": f"demo-{i}", "public_ip": f"54.1.2.{i + 3}",
                   "private_ip": f"10.42.0.{10 + i}", "transport": "ssh"} for i in range(2)]})
    (project_dir / "train.py").write_text("print('hi')\n")
    run_id, run_dir = new_run(project, "demo")
    new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir, script=["train.py"])
    assert 'export PYTHONPATH="$PWD/' in (run_dir / "node-1.sh").read_text()


SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
import fatpipe.trainer.api as fatpipe
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
try:
    fatpipe.wrap(model, comm="diloco", run_dir=sys.argv[1])
except RuntimeError as e:
    print("refused:", e)
if sys.argv[2] == "fp16":  # on a DDP model the script built itself
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = fatpipe.attach(DDP(model), comm="fp16", steps=3, run_dir=sys.argv[1])
else:
    ddp = fatpipe.wrap(model, comm=sys.argv[2], steps=3, run_dir=sys.argv[1],
                       allow_periodic=sys.argv[2] == "diloco")
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
records = []
for _ in range(3):
    loss = ddp(torch.randn(8, 16)).square().mean()
    loss.backward()
    opt.step()
    records.append(fatpipe.step(loss, tokens=8, lr=0.1))
    opt.zero_grad()
print(json.dumps({"ddp": type(ddp).__name__, "records": records}))
sys.stdout.flush()
fatpipe.finish()
os._exit(0)
"""


def run_script(folder, comm: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), comm], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: comm=diloco changes the optimizer step: pass allow_periodic=True" in done.stdout
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("comm", ["bf16", "fp16", "auto", "diloco"])
def test_steps_are_recorded_into_the_run_folder_as_the_trainer_does(tmp_path, comm):
    out = run_script(tmp_path, comm)
    assert out["ddp"] == "DistributedDataParallel"
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == out["records"] and [r["step"] for r in lines] == [1, 2, 3]
    want = "none" if comm == "auto" else comm  # one rank: nothing to send, auto says none
    assert all(r["comm"] == want and r["step_s"] > 0 and r["loss"] > 0 for r in lines)
    if comm in ("bf16", "fp16"):
        assert all(0 < r["wire_bytes"] * 2 == r["grad_bytes"] for r in lines)
    if comm == "diloco":  # nothing sent until the last step, which always synchronises
        assert [r["wire_bytes"] > 0 for r in lines] == [False, False, True]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["comm_decision"]["comm"] == want and summary["tokens_per_s"] > 0
    shown = run_summary(tmp_path, 1.0)
    assert shown["steps"] == 3 and shown["comm"] == want and shown["world_size"] == 1
    assert shown["failed_collectives"] == 0
    if comm != "diloco":  # one gradient sync per step (trainer.comm.periodic's syncs are not counted)
        assert shown["collectives_attempted"] >= 3
    assert json.loads((tmp_path / "faults.json").read_text())["failed_collectives"] == 0
    assert (tmp_path / "nodes.jsonl").exists()  # the last step closes the node-metrics window
