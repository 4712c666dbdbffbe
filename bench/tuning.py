"""The seed's TCP tuning, measured: 2 `vm` nodes (real kernels), the link shaped on the taps, a round
trip set with netem inside the guests, and per RTT row three profiles side by side in one run.

- default: the distribution's values of every sysctl the tier profile sets and the NIC's root
  qdisc, as the VM seed's first-boot snapshot recorded them (/var/lib/fatpipe/kernel-sysctls.json,
  written by cloud-init's bootcmd before write_files puts the profile's sysctl file down:
  the kernel's own values plus what Debian's systemd sysctl.d sets, e.g. default_qdisc);
- tier: the 1g profile as deployed (buffers for the 10 ms RTT budget);
- sized: tier_profile("1g", rtt_budget_ms=max(rtt, 10)), buffers for the row's round trip.

Each profile is applied with `sysctl -w` and `tc qdisc replace` on both VMs (every value one
quoted argument) and read back; then a single-flow iperf3 (VM 0 to VM 1) and a gloo all-reduce
of a gradient-sized fp32 buffer (a new gloo group per profile, so its sockets are made under it;
a warm-up, then timed ones; busbw = bytes x 2(n-1)/n / time). The VMs run under TCG when KVM does
not work, one emulated vCPU each: `--rate-mbit` shapes the taps below what that CPU can carry.

    sudo .venv/bin/python bench/tuning.py [--rtts 0,20,50,100] [--seconds 8] [--rate-mbit 300]
        [--keep] [--out bench/results/tuning.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER, CIDR = "btuning", "10.190.0.0/24"
IPERF_PORT, GLOO_PORT = 5291, 29591
IPERF_PID = "/tmp/fatpipe-tuning-iperf3.pid"
PROFILES = ("default", "tier", "sized")
SYSCTL, TC = "/usr/sbin/sysctl", "/usr/sbin/tc"  # a login's PATH on Debian has no /usr/sbin


class Guests:
    """The 2 VMs over SSH (one multiplexed connection each: a handshake costs seconds under TCG)."""

    def __init__(self, folder: Path, ips: list[str], control: str):
        self.key, self.ips, self.control = folder / ".fatpipe" / CLUSTER / "ssh" / "id_ed25519", ips, control

    def options(self) -> list[str]:
        return ["-i", str(self.key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control}/%C", "-o", "ControlPersist=600"]

    def argv(self, index: int, command: list[str]) -> list[str]:
        return ["ssh", *self.options(), f"debian@{self.ips[index]}", shlex.join(command)]

    def run(self, index: int, command: list[str], timeout: float = 300, stdin: str | None = None) -> str:
        proc = subprocess.run(self.argv(index, command), input=stdin, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.ips[index]}: {shlex.join(command)[:120]}: {proc.stderr.strip()[-400:]}")
        return proc.stdout

    def close(self) -> None:
        for ip in self.ips:
            subprocess.run(["ssh", *self.options(), "-O", "exit", f"debian@{ip}"], capture_output=True, timeout=30)


def profiles(snapshot: dict, rtt_ms: float) -> dict[str, tuple[dict[str, str], str]]:
    from fatpipe.infra.spec import DEFAULT_MAX_RTT_MS
    from fatpipe.infra.tiers import tier_profile

    return {"default": (snapshot["sysctls"], snapshot["root_qdisc"]),
            "tier": (tier_profile("1g").sysctls, "fq"),
            "sized": (tier_profile("1g", rtt_budget_ms=max(rtt_ms, DEFAULT_MAX_RTT_MS)).sysctls, "fq")}


def apply_profile(guests: Guests, index: int, nic: str, sysctls: dict[str, str], qdisc: str) -> None:
    """Set the sysctls and the NIC's root qdisc, then read them back: a refused value fails the run."""
    from fatpipe.infra.tiers import sysctl_mismatches

    guests.run(index, ["sudo", SYSCTL, "-q", "-w", *(f"{n}={v}" for n, v in sysctls.items())])
    guests.run(index, ["sudo", TC, "qdisc", "replace", "dev", nic, "root", qdisc])
    values = guests.run(index, [SYSCTL, "-n", *sysctls]).splitlines()
    wrong = sysctl_mismatches(sysctls, dict(zip(sysctls, values, strict=True)))
    shown = guests.run(index, [TC, "-j", "qdisc", "show", "dev", nic, "root"])
    if wrong or json.loads(shown)[0]["kind"] != qdisc:
        raise RuntimeError(f"{guests.ips[index]}: profile not applied: {wrong or shown}")


def iperf3(guests: Guests, seconds: int) -> dict:
    """One flow VM 0 -> VM 1; the first 2 s (slow start) omitted."""
    doc = json.loads(guests.run(0, ["iperf3", "-c", guests.ips[1], "-p", str(IPERF_PORT), "-t", str(seconds),
                                    "-O", "2", "-J"], timeout=seconds + 120))
    sender = doc["end"]["streams"][0]["sender"]
    return {"gbps": doc["end"]["sum_received"]["bits_per_second"] / 1e9,
            "mean_rtt_ms": sender.get("mean_rtt", 0) / 1000, "max_cwnd_bytes": sender.get("max_snd_cwnd")}


def start_allreduce(guests: Guests, nic: str, port: int, args) -> list[subprocess.Popen]:
    venv_python = f"fatpipe/{CLUSTER}/.fatpipe/venv/bin/python"
    procs = [subprocess.Popen(guests.argv(i, [venv_python, "tuning_allreduce.py", str(i), guests.ips[0], str(port),
                                              nic, str(args.mib), str(args.iters)]),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in (0, 1)]
    for proc in procs:
        read_json_line(proc)  # {"ready": true}: torch imported, the group joined
    return procs


def read_json_line(proc: subprocess.Popen) -> dict:
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the all-reduce process ended (exit {proc.wait()})")
        if line.startswith("{"):
            return json.loads(line)


def allreduce_phase(procs: list[subprocess.Popen], phase: str, mib: int) -> dict:
    for proc in procs:
        proc.stdin.write(phase + "\n")
        proc.stdin.flush()
    times = max((read_json_line(proc)["times"] for proc in procs), key=statistics.median)
    seconds = statistics.median(times)
    return {"busbw_gbps": (mib << 20) * 8 * 2 * (2 - 1) / 2 / seconds / 1e9, "times_s": times}


def measure_row(guests: Guests, snapshots: list[dict], rtt_ms: float, args) -> dict:
    for index in (0, 1):  # half the round trip on each VM's ingress
        guests.run(index, ["sudo", TC, "qdisc", "change", "dev", "fprtt0", "root", "netem", "delay",
                           f"{rtt_ms / 2:g}ms", "limit", "100000"])
    procs = start_allreduce(guests, snapshots[0]["nic"], GLOO_PORT + int(rtt_ms), args)
    cells = {}
    try:
        for name in PROFILES:
            for index in (0, 1):
                apply_profile(guests, index, snapshots[index]["nic"], *profiles(snapshots[index], rtt_ms)[name])
            cells[name] = {"iperf3": iperf3(guests, args.seconds), "allreduce": allreduce_phase(procs, name, args.mib)}
            print(f"  rtt {rtt_ms:g} ms {name}: iperf3 {cells[name]['iperf3']['gbps']:.3f} Gbit/s, "
                  f"all-reduce {cells[name]['allreduce']['busbw_gbps']:.3f} Gbit/s", flush=True)
        for proc in procs:
            proc.stdin.write("quit\n")
            proc.stdin.flush()
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {"rtt_ms": rtt_ms, "bdp_mb": args.rate_mbit * 1e6 / 8 * rtt_ms / 1000 / 1e6, "cells": cells,
            "sized_buffer": profiles(snapshots[0], rtt_ms)["sized"][0]["net.core.rmem_max"]}


def table(rows: list[dict]) -> str:
    lines = ["| RTT ms | BDP MB | iperf3 default / tier / sized (Gbit/s) | sized / default | "
             "all-reduce busbw default / tier / sized (Gbit/s) |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        iperf = [row["cells"][p]["iperf3"]["gbps"] for p in PROFILES]
        busbw = [row["cells"][p]["allreduce"]["busbw_gbps"] for p in PROFILES]
        lines.append(f"| {row['rtt_ms']:g} | {row['bdp_mb']:.2f} | {' / '.join(f'{g:.3f}' for g in iperf)} | "
                     f"{iperf[2] / iperf[0]:.2f} | {' / '.join(f'{g:.3f}' for g in busbw)} |")
    return "\n".join(lines)


def goals(rows: list[dict], rate_mbit: float) -> list[str]:
    link = rate_mbit / 1000
    said = []
    for row in rows:
        iperf = {p: row["cells"][p]["iperf3"]["gbps"] for p in PROFILES}
        if row["rtt_ms"] >= 50:
            met = iperf["sized"] >= 0.9 * link and iperf["default"] < 0.9 * link
            said.append(f"RTT {row['rtt_ms']:g} ms: sized carries {iperf['sized'] / link:.2f} of the {link:g} Gbit/s "
                        f"link, default {iperf['default'] / link:.2f} "
                        f"(sized/default {iperf['sized'] / iperf['default']:.2f}): "
                        f"{'met' if met else 'NOT met'}")
        if row["rtt_ms"] == 0:  # sized == tier at 0 ms: their difference is the run's noise
            noise = abs(iperf["sized"] / iperf["tier"] - 1)
            cost = 1 - iperf["tier"] / iperf["default"]
            said.append(f"RTT 0 ms: tier/default {iperf['tier'] / iperf['default']:.3f} (same profile twice differs by "
                        f"{noise:.3f}): "
                        f"{'costs nothing within noise' if cost <= max(noise, 0.03) else 'NOT within noise'}")
    return said


def leftovers(folder: Path) -> list[str]:
    from fatpipe.infra.project import project_id_at
    from fatpipe.stacks.vm.node import vm_names

    names = vm_names(project_id_at(folder, create=False), CLUSTER, 0)
    found = [f"link {link}" for link in os.listdir("/sys/class/net")
             if link == names["bridge"] or link.startswith(names["tap"][:-1])]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    found += [f"process {line[:80]}" for line in ps.splitlines() if f"fatpipe-{CLUSTER}-" in line]
    return found + [f"file {p}" for p in (folder / ".fatpipe" / CLUSTER).glob("nodes/*/*")]


def fatpipe(folder: Path, control: str, *args: str, timeout: float = 2400) -> None:
    env = {**os.environ, "FATPIPE_SSH_CONTROL_DIR": control, "COLUMNS": "200",
           "FATPIPE_VM_CACHE": os.environ.get("FATPIPE_VM_CACHE") or str(REPO / ".tools" / "vm-image")}
    proc = subprocess.run([sys.executable, "-m", "fatpipe.cli", *args], cwd=folder, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"fatpipe {' '.join(args)} failed:\n{proc.stdout[-3000:]}")


def run_bench(folder: Path, control: str, args) -> list[dict]:
    from fatpipe.infra.project import load_project
    from fatpipe.infra.tiers import sysctl_mismatches, tier_profile
    from fatpipe.stacks.vm.seed import KERNEL_SYSCTLS

    cluster = load_project(folder / "fatpipe.toml").clusters[CLUSTER]
    fatpipe(folder, control, "deploy", CLUSTER)
    fatpipe(folder, control, "wait", CLUSTER, "--wait-timeout", "1800")
    guests = Guests(folder, [cluster.private_ip(i) for i in (0, 1)], control)
    try:
        snapshots = [json.loads(guests.run(i, ["cat", KERNEL_SYSCTLS])) for i in (0, 1)]
        print(f"kernel defaults: {json.dumps(snapshots[0])}", flush=True)
        names = list(tier_profile("1g").sysctls)
        for index in (0, 1):  # "tier" is the profile as deployed
            deployed = dict(zip(names, guests.run(index, [SYSCTL, "-n", *names]).splitlines(), strict=True))
            if sysctl_mismatches(tier_profile("1g").sysctls, deployed):
                raise RuntimeError(f"VM {index} did not boot with the 1g profile: {deployed}")
        for index in (0, 1):
            guests.run(index, ["sh", "-c", 'cat > "$1"', "-", "tuning_allreduce.py"],
                       stdin=(REPO / "bench" / "tuning_allreduce.py").read_text())
        guests.run(1, ["iperf3", "-s", "-D", "-p", str(IPERF_PORT), "-I", IPERF_PID])
        rows = [measure_row(guests, snapshots, rtt, args) for rtt in args.rtts]
        guests.run(1, ["sh", "-c", 'kill "$(cat "$1")"', "-", IPERF_PID])
        return [{**row, "kernel_defaults": snapshots[0]} for row in rows]
    finally:
        guests.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rtts", type=lambda s: [float(x) for x in s.split(",")], default=[0, 20, 50, 100])
    p.add_argument("--seconds", type=int, default=8, help="iperf3's measured seconds (2 more are omitted)")
    p.add_argument("--rate-mbit", type=float, default=1000, help="the taps' rate (the cluster's link_gbps)")
    p.add_argument("--mib", type=int, default=64, help="the all-reduce's fp32 buffer")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="leave the cluster up (and its folder)")
    p.add_argument("--out", default="bench/results/tuning.json")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("terraform"):
        print("needs root (taps, a bridge) and terraform on PATH")
        return 1
    folder = Path(tempfile.mkdtemp(prefix="fatpipe-tuning-bench-"))
    control = tempfile.mkdtemp(prefix="fp-tun-")  # ssh's sockets need a short path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        rdzv = s.getsockname()[1]
    (folder / "fatpipe.toml").write_text(
        f'[clusters.{CLUSTER}]\nprovider = "vm"\nnodes = 2\ntier = "1g"\nprivate_cidr = "{CIDR}"\n'
        f"rdzv_port = {rdzv}\nrtt_ms = 1\nlink_gbps = {args.rate_mbit / 1000:g}\n")
    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        rows = run_bench(folder, control, args)
    finally:
        if args.keep:
            print(f"kept: {folder} (fatpipe down {CLUSTER} there)")
        else:
            fatpipe(folder, control, "down", CLUSTER, timeout=600)
            left = leftovers(folder)
            print("down: nothing left" if not left else f"down LEFT: {left}")
            shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(control, ignore_errors=True)
    import torch

    accel = [json.loads(f.read_text())["accel"] for f in (REPO / ".tools" / "vm-image").glob("*/accel.json")]
    doc = {"bench": "tuning", "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "command": " ".join(sys.argv),
           "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "load_after": os.getloadavg()[0]},
           "vms": {"nodes": 2, "vcpus": 1, "memory_mib": 1024, "accel": accel[:1]}, "rate_mbit": args.rate_mbit,
           "iperf3_seconds": args.seconds, "allreduce_mib": args.mib, "rows": rows}
    doc["table"], doc["goals"] = table(rows), goals(rows, args.rate_mbit)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(doc["table"])
    print("\n".join(doc["goals"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
