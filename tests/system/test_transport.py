"""Transports: one interface over ssh, netns and this machine; commands fan out in parallel."""

from __future__ import annotations

import subprocess
import time

import pytest

from fatpipe.infra.outputs import parse_outputs
from fatpipe.ops.reach.transport import (
    LocalTransport,
    NetnsTransport,
    SshTransport,
    fan_out,
    transports_for,
)


def test_local_run_timeout_and_stream():
    t = LocalTransport("n0")
    done = t.run("echo out; echo err >&2; exit 3")
    assert (done.returncode, done.stdout, done.reason()) == (3, "out\n", "err")
    slow = t.run("sleep 5", timeout=0.5)
    assert slow.returncode == 124 and "timed out" in slow.reason()
    proc = t.popen("for i in 1 2 3; do echo line $i; done")
    assert proc.stdout.read().splitlines() == ["line 1", "line 2", "line 3"]
    assert proc.wait(5) == 0


def test_fan_out_is_parallel_and_ordered():
    nodes = [LocalTransport(f"n{i}") for i in range(4)]

    def call(t):
        return t.run(f"sleep 0.5; echo {t.node_name}")

    started = time.monotonic()
    for t in nodes:
        call(t)
    serial_s = time.monotonic() - started
    started = time.monotonic()
    results = fan_out(call, nodes)
    parallel_s = time.monotonic() - started
    # The same four calls one after another take four times one call; in parallel about one.
    assert parallel_s < serial_s / 2, (parallel_s, serial_s)
    assert [r.stdout.strip() for r in results] == ["n0", "n1", "n2", "n3"]
    assert fan_out(lambda x: x * 2, [3, 1, 2]) == [6, 2, 4]


def test_ssh_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("FATPIPE_SSH_CONFIG", str(tmp_path / "ssh_config"))
    outputs = parse_outputs({
        "name": "c", "provider": "digitalocean", "tier_gbps": 10, "private_cidr": "10.42.0.0/24",
        "ssh_user": "ubuntu",
        "nodes": [{"name": "c-0", "public_ip": "54.1.2.3", "private_ip": "10.42.0.10", "transport": "ssh",
                   "ssh_port": 2222},
                  {"name": "c-1", "private_ip": "10.42.0.11", "transport": "netns", "netns": "fp-c-1"},
                  {"name": "c-2", "private_ip": "10.42.0.12", "transport": "local"}],
    })
    ssh, netns, local = transports_for(outputs, tmp_path / "state")
    assert isinstance(ssh, SshTransport) and isinstance(netns, NetnsTransport)
    assert isinstance(local, LocalTransport) and local.shares_fs and netns.shares_fs and not ssh.shares_fs
    argv = ssh.argv("echo 'hi there'")
    joined = " ".join(argv)
    for option in ("BatchMode=yes", "StrictHostKeyChecking=accept-new", "ControlMaster=auto",
                   f"UserKnownHostsFile={tmp_path / 'state' / 'known_hosts'}", "ControlPersist="):
        assert option in joined
    assert argv[:3] == ["ssh", "-F", str(tmp_path / "ssh_config")]
    aws = transports_for(outputs.model_copy(update={"provider": "aws"}), tmp_path / "state")[0]
    assert "StrictHostKeyChecking=yes" in aws.argv("true")  # keys pinned from the console only
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "ubuntu"
    assert argv[-2] == "54.1.2.3" and argv[-1] == "bash -c 'echo '\"'\"'hi there'\"'\"''"
    assert netns.argv("true") == ["ip", "netns", "exec", "fp-c-1", "bash", "-c", "true"]


def test_unreachable_ssh_node_fails_fast(tmp_path):
    # Port 9 (discard) on loopback refuses: BatchMode means no prompt, a clean one-line reason.
    t = SshTransport("n0", "127.0.0.1", tmp_path / "known_hosts", port=9, config="/dev/null")
    done = t.run("true", timeout=20)
    assert done.returncode == 255 and "refused" in done.reason().lower()


def test_netns_transport_runs_inside_the_namespace(needs_netns, tmp_path):
    ns = f"fp-tt-{int(time.time() * 1000) % 100000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        t = NetnsTransport("n0", ns)
        links = t.run("ip -o link show | wc -l").stdout.strip()
        assert links == "1"  # a fresh namespace holds only lo
        assert t.run(f"echo inside > {tmp_path / 'mark'}").ok
        assert (tmp_path / "mark").read_text() == "inside\n"  # the namespace sees this machine's files
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


@pytest.mark.parametrize("kind", ["local", "netns"])
def test_shared_fs_transports_refuse_to_copy(kind, tmp_path):
    t = LocalTransport("n") if kind == "local" else NetnsTransport("n", "x")
    from fatpipe.infra.errors import FatpipeError

    with pytest.raises(FatpipeError, match="shares this machine's files"):
        t.push(tmp_path, "x")
