"""From `fatpipe up` to the first training step on cold nodes, and the bytes over the operator's link.

Four sim nodes over SSH (netns, an sshd each, their own folders), deployed once. "The index" is a
PEP 503 index this script serves on the operator's address of the private network, made from
the wheels pip finds for this machine's torch and numpy (this machine reaches PyPI only; torch
is a local CPU wheel, so a local index stands in for the real one), counting the bytes it serves.
Two ways, side by side in one run, each from cold folders (no venv, no wheels):

- before: every node builds its venv from the index (`pip install --index-url ...`, as node
  venvs were built before wheels travelled like data), then `fatpipe up`;
- after: `fatpipe up` alone: node 0 downloads once, the others install from it offline.

Then, on the nodes now warm, `fatpipe launch -- examples/ddp_script.py` to its first step against
the same script started by hand with torchrun (bench/warm_launch.py: the ratio, alternating,
medians of `--repeat`), and the API's step overhead on a user script (bench/api_overhead.py, run as
it is). `--warm` runs the warm comparison alone (a few minutes). Needs root, sshd and terraform,
like the sim's system tests.

    sudo .venv/bin/python bench/first_step.py [--warm] [--repeat 3] [--nodes 4] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fatpipe.infra.node import REMOTE_VENV
from fatpipe.infra.nodevenv import STAMP_FILE
from fatpipe.infra.outputs import parse_outputs
from fatpipe.ops.reach.projectdir import claim_project_dir
from fatpipe.ops.reach.transport import fan_out, transports_for

NAME, OCTET = "bench-wheels", 229  # an octet no system test uses
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))  # the counting index the node-wheels test uses
import warm_launch  # noqa: E402
from wheelindex import CountingIndex  # noqa: E402

CLI = [sys.executable, "-m", "fatpipe.cli"]


def cli_env() -> dict[str, str]:
    """The CLI as a user runs it: the [node] table, not this shell's torch overrides, says what nodes get."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for name in ("FATPIPE_TORCH", "FATPIPE_TORCH_INDEX_URL", "FATPIPE_CONFIG"):
        env.pop(name, None)
    return env


def cli(folder: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=cli_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def index_files(folder: Path) -> None:
    import torch

    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(folder),
                    f"torch=={torch.__version__}", "numpy"], check=True, timeout=1800)


def project_toml(nodes: int) -> str:
    return f"""\
[clusters.{NAME}]
provider = "sim"
nodes = {nodes}
tier = "1g"
isolation = "netns"
transport = "ssh"
private_cidr = "10.{OCTET}.0.0/24"
rdzv_port = {free_port()}

[train]
preset = "tiny"
steps = 3
comm = "none"
batch_size = 2
seq_len = 32
warmup_steps = 1
checkpoint_every = 100
node_metrics_every = 0
"""


def make_cold(outputs) -> None:
    """No venv and no wheels on any node: each scenario starts from nothing."""
    for node in outputs.nodes:
        for path in (REMOTE_VENV, ".fatpipe/wheels"):
            shutil.rmtree(Path(node.remote_dir) / path, ignore_errors=True)


def up_to_first_step(folder: Path) -> tuple[float, bool]:
    """Seconds from starting `fatpipe up` (deployed: no deploy phase) to the first step's line."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "fatpipe.cli", "up", NAME, "--netcheck", "off"], cwd=folder,
                            env=cli_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first, lines = None, []
    for line in proc.stdout:
        lines.append(line)
        if first is None and "step 1/" in line:
            first = time.monotonic() - started
    ok = proc.wait() == 0 and first is not None
    if not ok:
        print("".join(lines[-40:]), file=sys.stderr)
    return first or float("nan"), ok


def each_node_from_index(folder: Path, outputs, index_url: str) -> None:
    """The way before: every node makes its venv from the index, and stamps it as fatpipe would."""
    from fatpipe.infra.nodevenv import node_venv, venv_stamp
    from fatpipe.infra.project import load_project

    project = load_project(folder / "fatpipe.toml")
    venv = node_venv(project, project.clusters.get(NAME), gpus=0)
    stamp, host = venv_stamp(project.root, venv), index_url.split("/")[2]
    py = f"{REMOTE_VENV}/bin/python"
    command = (f"export PIP_CONFIG_FILE=/dev/null; set -e; python3 -m venv --clear {REMOTE_VENV}; "
               f"{py} -m pip install -q --index-url {shlex.quote(index_url)} --trusted-host {shlex.quote(host)} "
               f"{shlex.quote(venv.torch)} numpy; echo {stamp} > {STAMP_FILE}")
    transports = transports_for(outputs, project.state_dir(NAME))
    for transport, node in zip(transports, outputs.nodes, strict=True):
        claim_project_dir(transport, node.remote_dir, NAME, project.project_id)  # as fatpipe marks it
    dirs = [shlex.quote(n.remote_dir) for n in outputs.nodes]
    results = fan_out(lambda pair: pair[0].run(f"cd {pair[1]} && {command}", timeout=3600),
                      list(zip(transports, dirs, strict=True)))
    bad = [r.reason() for r in results if not r.ok]
    if bad:
        raise SystemExit(f"a node could not build its venv from the index: {bad[0]}")


def scenario(folder: Path, outputs, index: CountingIndex, before: bool) -> dict:
    make_cold(outputs)
    index.bytes, started = 0, time.monotonic()
    if before:
        each_node_from_index(folder, outputs, index.url)
    installed_s = time.monotonic() - started
    up_s, ok = up_to_first_step(folder)
    return {"ok": ok, "to_first_step_s": installed_s + up_s, "index_bytes": index.bytes,
            "load_after": os.getloadavg()[0]}


def api_overhead(out: Path) -> dict:
    subprocess.run([sys.executable, str(BENCH / "api_overhead.py"), "--steps", "100", "--out", str(out)],
                   check=True, timeout=1800)
    return {**json.loads((out / "api_overhead.json").read_text()), "load_after": os.getloadavg()[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--out", type=Path, default=BENCH / "results")
    p.add_argument("--repeat", type=int, default=3, help="runs of each way in the warm comparison")
    p.add_argument("--warm", action="store_true", help="only launch against torchrun by hand on warm nodes")
    p.add_argument("--name", default=NAME, help="the sim cluster's name")
    p.add_argument("--octet", type=int, default=OCTET, help="its private network: 10.OCTET.0.0/24")
    args = p.parse_args()
    globals().update(NAME=args.name, OCTET=args.octet)  # what project_toml and the scenarios read
    if args.warm:
        return warm_only(args)
    with tempfile.TemporaryDirectory(prefix="fp-first-step-") as tmp:
        folder, files = Path(tmp) / "project", Path(tmp) / "files"
        folder.mkdir()
        files.mkdir()
        index_files(files)
        (folder / "fatpipe.toml").write_text(project_toml(args.nodes))
        deployed = cli(folder, "deploy", NAME, "--yes")
        if deployed.returncode:
            raise SystemExit(deployed.stdout[-3000:])
        try:
            outputs = parse_outputs(json.loads((folder / ".fatpipe" / NAME / "outputs.json").read_text()))
            index = CountingIndex(files, Path(tmp) / "index", f"10.{OCTET}.0.1")
            with open(folder / "fatpipe.toml", "a") as toml:
                toml.write(f'\n[node]\ntorch_index = "{index.url}"\n')
            import torch

            doc = {"bench": "first_step", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                            "python": sys.version.split()[0], "torch": torch.__version__},
                   "nodes": args.nodes, "wheel_bytes": sum(f.stat().st_size for f in files.glob("*.whl")),
                   "before": scenario(folder, outputs, index, before=True),
                   "after": scenario(folder, outputs, index, before=False)}
            doc["warm_launch"] = warm_launch.compare(folder, CLI, cli_env(), args.repeat)
            index.server.shutdown()
        finally:
            cli(folder, "down", NAME, timeout=600)
        doc["api_overhead"] = api_overhead(Path(tmp) / "api")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_step.json").write_text(json.dumps(doc, indent=2) + "\n")
    b, a = doc["before"], doc["after"]
    print(f"{args.nodes} cold nodes        {'before':>12} {'after':>12}")
    print(f"up -> first step (s)  {b['to_first_step_s']:12.1f} {a['to_first_step_s']:12.1f}")
    print(f"index bytes (MB)      {b['index_bytes'] / 1e6:12.1f} {a['index_bytes'] / 1e6:12.1f}")
    o = doc["api_overhead"]
    print(f"API step overhead: ratio {o['ratio']:.3f} ({(o['ratio'] - 1) * 100:+.1f}%, goal < 2%); "
          f"load {b['load_after']:.1f} / {a['load_after']:.1f} / {o['load_after']:.1f} after each part")
    warm_launch.print_table(doc["warm_launch"], args.nodes)
    return 0 if b["ok"] and a["ok"] else 1


def warm_only(args) -> int:
    """Deploy, warm the nodes with one launch, then launch against torchrun by hand."""
    with tempfile.TemporaryDirectory(prefix="fp-first-step-") as tmp:
        folder = Path(tmp) / "project"
        folder.mkdir()
        (folder / "fatpipe.toml").write_text(project_toml(args.nodes))
        deployed = cli(folder, "deploy", NAME, "--yes")
        if deployed.returncode:
            raise SystemExit(deployed.stdout[-3000:])
        try:
            # The environment in place: the nodes (this machine's folders) run this interpreter.
            env = {**cli_env(), "FATPIPE_REMOTE_PYTHON": sys.executable}
            doc = warm_launch.compare(folder, CLI, env, args.repeat)
        finally:
            cli(folder, "down", NAME, timeout=600)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_step_warm.json").write_text(json.dumps(doc, indent=2) + "\n")
    warm_launch.print_table(doc, args.nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
