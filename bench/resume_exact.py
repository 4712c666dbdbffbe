"""How often a run stopped and started again on its nodes ends bit-exact with an uninterrupted one,
through the node's real run wrapper (ops.rdzv.noderun): the rate behind the resume check of
tests/system/test_run_on_nodes.py, measured cheaply on this machine.

Two "nodes" on this machine (local transport, 127.0.0.1 and 127.0.0.2, a project folder each, as
ssh nodes have their own disks), one worker each, the built-in trainer's `tiny` preset. Each round
starts the run through the wrapper, stops it (`runproc.stop`, as `fatpipe stop` does) once node
0 holds the checkpoint of step STOP_AT, starts it again in the same folder (`launch --run ID`'s
path) and compares the final parameters (summary.json's digests) with an uninterrupted run's.

`--threads unpinned` leaves OMP_NUM_THREADS out of the nodes' environment (the worker then uses
every core, as on ssh-transport sim nodes before they were pinned); `--threads N` pins it; by
default the nodes get what ops.rdzv.rendezvous gives a node sharing this machine. A round whose
run ended before the stop reached it is no resume: counted apart (more `--steps` leave room).
Prints one line per round and the count; writes bench/out/resume_exact.json.

    python bench/resume_exact.py --rounds 10 [--threads unpinned] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from fatpipe.ops.rdzv.nodefiles import node_env_text, node_script_text, torchrun_command
from fatpipe.ops.rdzv.noderun import NodeRun
from fatpipe.ops.rdzv.record import NodePlan, Rendezvous
from fatpipe.ops.rdzv.rendezvous import trainer_entry
from fatpipe.ops.reach.transport import LocalTransport
from fatpipe.ops.run.launch import stop_nodes

EVERY, STOP_AT = 4, 8
TRAIN = ["--preset", "tiny", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "3",
         "--checkpoint-every", str(EVERY), "--comm", "none"]
RUN_REL = "runs/r1"
END_S = 600
OUT = Path(__file__).with_name("out") / "resume_exact.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan_nodes(base: Path, threads: str | None, steps: int) -> list[NodeRun]:
    """Two local nodes, each with a project folder of its own under `base`, their files written."""
    env = {"PYTHONUNBUFFERED": "1", "NCCL_SHM_DISABLE": "1"}
    if threads != "unpinned":
        env["OMP_NUM_THREADS"] = threads or str(max(1, (os.cpu_count() or 1) // 2))
    if os.environ.get("PYTHONPATH"):  # a tree other than the installed one
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    plans = [NodePlan(rank=i, name=f"n{i}", transport="local", private_ip=f"127.0.0.{i + 1}",
                      public_ip=None, netns=None, workdir=str(base / f"node-{i}"),
                      python=sys.executable, env={**env, "FATPIPE_NODE_NAME": f"n{i}",
                                                  "FATPIPE_NODE_RANK": str(i),
                                                  "FATPIPE_PRIVATE_IP": f"127.0.0.{i + 1}"})
             for i in range(2)]
    rdzv = Rendezvous(run_id="r1", cluster="bench", provider="sim", nnodes=2, nproc_per_node=1,
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0,
                      join_timeout_s=60, run_rel=RUN_REL, entry=trainer_entry(RUN_REL, [*TRAIN, "--steps", str(steps)]),
                      builtin_trainer=True, tier_gbps=1, created="", nodes=plans)
    for plan in plans:
        plan.command = torchrun_command(rdzv, plan)
        run = Path(plan.workdir) / RUN_REL
        run.mkdir(parents=True)
        (run / f"node-{plan.rank}.env").write_text(node_env_text(rdzv, plan))
        (run / f"node-{plan.rank}.sh").write_text(node_script_text(rdzv, plan))
    return [NodeRun(rdzv, plan, LocalTransport(plan.name)) for plan in plans]


def start(nodes: list[NodeRun]) -> None:
    for node in nodes:
        done = node.transport.run(node.start_command(), timeout=60)
        if not done.ok:
            raise SystemExit(f"{node.name}: {done.reason()}")


def wait_for(what: str, check, timeout_s: float = END_S):
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)
    return found


def ended(nodes: list[NodeRun]) -> list[str]:
    states = [n.status() for n in nodes]
    return states if all(s.lstrip("-").isdigit() for s in states) else []


def digests(node0: NodeRun) -> list:
    return json.loads((Path(node0.plan.workdir) / RUN_REL / "summary.json").read_text())["param_digests"]


def whole_run(base: Path, threads: str | None, steps: int) -> list:
    nodes = plan_nodes(base, threads, steps)
    start(nodes)
    states = wait_for("the reference run's end", lambda: ended(nodes))
    if states != ["0", "0"]:
        raise SystemExit(f"the reference run failed: {states} ({base})")
    return digests(nodes[0])


def stopped_and_resumed(base: Path, threads: str | None, steps: int) -> tuple[list, list[str]]:
    """(final digests, the stopped attempt's node states) of a run stopped at STOP_AT and started
    again."""
    nodes = plan_nodes(base, threads, steps)
    start(nodes)
    folder = Path(nodes[0].plan.workdir) / RUN_REL / "checkpoints"

    def past_stop_at() -> bool:  # the last two are kept: step STOP_AT's may be gone already
        return any(int(p.name[5:13]) >= STOP_AT for p in folder.glob("step-*.pt"))

    wait_for("the checkpoint to stop at", lambda: past_stop_at() or ended(nodes))
    stop_nodes(nodes)
    first = [n.status() for n in nodes]
    start(nodes)
    second = wait_for("the resumed run's end", lambda: ended(nodes))
    if second != ["0", "0"]:
        raise SystemExit(f"the resumed run failed: {second} ({base})")
    return digests(nodes[0]), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", default=None, help="unpinned, or OMP_NUM_THREADS for each node")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fp-resume-"))
    began = time.monotonic()
    reference = whole_run(base / "reference", args.threads, args.steps)
    exact = resumed = 0
    for i in range(args.rounds):
        got, first = stopped_and_resumed(base / f"round-{i}", args.threads, args.steps)
        stopped = first != ["0", "0"]  # else the run ended before the stop: no resume
        resumed += stopped
        exact += stopped and got == reference
        print(f"round {i}: stopped with {first}, {'bit-exact' if got == reference else 'DIFFERS'}"
              f"{'' if stopped else ' (ended before the stop: no resume)'}", flush=True)
    print(f"{exact} of {resumed} resumed runs bit-exact ({args.rounds - resumed} ended before the "
          f"stop; threads: {args.threads or 'as planned'}; {time.monotonic() - began:.0f} s)")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"rounds": args.rounds, "resumed": resumed, "exact": exact,
                               "threads": args.threads, "steps": args.steps, "stop_at": STOP_AT},
                              indent=1) + "\n")


if __name__ == "__main__":
    main()
