"""Round trips per node per command, and each command's time, on throw-away sim clusters reached
over SSH (issue 35, item 1): wait, launch (detached), status, logs, pull, stop, down.

Deploys a sim cluster of each size (netns isolation, an sshd per node; needs root, terraform,
sshd and rsync) and runs every command through an `ssh` on PATH that logs each session before it
runs the real one (tests/countingssh.py: a transfer, a launch's start, the project push's
record, a follower's stream, or a check); the table shows the checks per node (the most any node
got) beside the rest, and the wall time of each command (the CLI's start and warm ssh masters
included). `status`'s time is the reference the data push's goal is measured against. On main
before the node program, a launch made 5 check round trips per ssh node (its run state, the
folder's claim, three folder makes) plus the project push's look and record, the venv stamp and
the environment probe importing torch; status 2 (3 on the leader), stop and logs 2.

    sudo .venv/bin/python bench/roundtrips.py [--nodes 2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))  # the counting ssh the round-trip test uses
import countingssh  # noqa: E402

OCTETS = {2: 232, 4: 233}
JOB = ("import pathlib, time\npathlib.Path('out').mkdir(exist_ok=True)\npathlib.Path('out/r.txt').write_text('x')\n"
       "time.sleep(120)\n")


def toml(name: str, nodes: int, octet: int) -> str:
    return (f'[clusters.{name}]\nprovider = "sim"\nnodes = {nodes}\ntier = "1g"\nisolation = "netns"\n'
            f'transport = "ssh"\nprivate_cidr = "10.{octet}.0.0/24"\n')


class Bench:
    def __init__(self, folder: Path):
        self.folder, self.counting = folder, countingssh.install(folder / "bin")
        self.control = tempfile.mkdtemp(prefix="fp-cm-rt-")

    def run(self, *args: str) -> tuple[float, Counter]:
        countingssh.sessions(self.counting)
        env = {**os.environ, **self.counting, "FATPIPE_SSH_CONTROL_DIR": self.control, "COLUMNS": "200",
               "NO_COLOR": "1", "PATH": f"{self.counting['PREPEND_PATH']}:{Path(sys.executable).parent}:"
                                        f"{os.environ['PATH']}"}
        env.pop("FATPIPE_CONFIG", None)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=self.folder, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
        took = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"fatpipe {' '.join(args)} failed:\n{done.stdout[-3000:]}")
        return took, countingssh.sessions(self.counting)


def row(size: int, command: str, took: float, found: Counter) -> dict:
    other = Counter()
    for (_, kind), n in found.items():
        if kind != "check":
            other[kind] += n
    return {"nodes": size, "command": command, "seconds": round(took, 2),
            "checks_per_node": countingssh.most_per_node(found), "other": dict(other)}


def written_on_node(folder: Path, name: str, rel: str, within_s: float = 300) -> None:
    """Wait until node 0's job wrote `rel` (a sim node's project folder lies on this machine)."""
    outputs = json.loads((folder / ".fatpipe" / name / "outputs.json").read_text())
    path, deadline = Path(outputs["nodes"][0]["remote_dir"]) / rel, time.monotonic() + within_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(1)


def measure(size: int) -> list[dict]:
    name = f"t-nc-rt{size}"
    folder = Path(tempfile.mkdtemp(prefix=f"fp-rt{size}-"))
    (folder / "fatpipe.toml").write_text(toml(name, size, OCTETS[size]))
    (folder / ".gitignore").write_text("bin/\ngot/\n")
    (folder / "job.py").write_text(JOB)
    bench, rows = Bench(folder), []
    commands = [("wait", name), ("launch", name, "--detach", "--max-restarts", "0", "--remote-python",
                                 sys.executable, "--", "job.py"),
                ("status", name), ("logs", name), ("pull", name, "out/r.txt", "--to", "got"), ("stop", name),
                ("status", name)]
    try:
        bench.run("deploy", name)
        for args in [*commands, ("down", name)]:
            if args[0] == "pull":  # once the job wrote it: its start imports torch, slow on a loaded machine
                written_on_node(folder, name, "out/r.txt")
            rows.append(row(size, args[0], *bench.run(*args)))
    finally:
        subprocess.run([sys.executable, "-m", "fatpipe.cli", "down", name], cwd=folder, capture_output=True,
                       timeout=300)
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2,4")
    sizes = [int(n) for n in parser.parse_args().nodes.split(",")]
    rows = [row for size in sizes for row in measure(size)]
    print(f"{'nodes':>5} {'command':<8} {'checks/node':>11} {'seconds':>8}  other sessions")
    for r in rows:
        other = ", ".join(f"{k} {n}" for k, n in sorted(r["other"].items()))
        print(f"{r['nodes']:>5} {r['command']:<8} {r['checks_per_node']:>11} {r['seconds']:>8.2f}  {other}")
    worst = max(r["checks_per_node"] for r in rows)
    print(f"goal: at most 1 check round trip per node per command: {'met' if worst <= 1 else 'missed'} "
          f"(most: {worst})")
    status = [r["seconds"] for r in rows if r["command"] == "status"]
    print(f"fatpipe status: {min(status):.2f} s (the reference for the data push's goal)")
    out = Path(__file__).with_name("out")
    out.mkdir(exist_ok=True)
    (out / "roundtrips.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
