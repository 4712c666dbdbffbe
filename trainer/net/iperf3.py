"""iperf3 as the p2p throughput tool: its server command and a client that parses its JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import time


def have_iperf3() -> bool:
    return shutil.which("iperf3") is not None


def iperf3_server_command(bind: str, port: int) -> list[str]:
    return ["iperf3", "--server", "--bind", bind, "--port", str(port)]


def iperf3_client(
    host: str, port: int, streams: int = 1, seconds: float = 3.0, bind: str | None = None,
    connect_timeout: float = 10.0,
) -> dict:
    """Run `iperf3 -c ... -J` and return its receiver-side sum."""
    cmd = ["iperf3", "--client", host, "--port", str(port), "--json",
           "--time", str(max(1, round(seconds))), "--parallel", str(streams)]
    if bind:
        cmd += ["--bind", bind]
    deadline = time.monotonic() + connect_timeout
    while True:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
        try:
            report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            report = {"error": proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}"}
        # A server that is still starting, or busy finishing the previous test, refuses us.
        if "error" not in report or time.monotonic() >= deadline:
            break
        time.sleep(0.3)
    if "error" in report:
        raise RuntimeError(f"iperf3 to {host}:{port}: {report['error']}")
    end = report["end"]
    received, sent = end["sum_received"], end["sum_sent"]
    return {"tool": "iperf3", "streams": streams, "bytes": int(received["bytes"]),
            "seconds": float(received["seconds"]), "gbps": received["bits_per_second"] / 1e9,
            "sender_gbps": sent["bits_per_second"] / 1e9}

