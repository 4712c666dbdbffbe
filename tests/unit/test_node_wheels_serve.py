"""Node 0's wheel server is started and watched by Python on the node (issue 35, item 1): a
server that cannot start is reported at once with its own error, not after the whole wait.
That it serves the folder in a group of its own: tests/unit/test_nodeenv.py."""

from __future__ import annotations

import re
import subprocess

import pytest

from fatpipe.ops.env.venvs import serve_command

pytestmark = pytest.mark.timeout(200)


def serve(folder, address: str) -> subprocess.CompletedProcess:
    (folder / ".fatpipe/wheels/abc").mkdir(parents=True, exist_ok=True)
    (folder / ".fatpipe/wheels/abc/x-1-py3-none-any.whl").write_bytes(b"w")
    return subprocess.run(["bash", "-c", f"cd {folder} && {serve_command('abc', address)}"],
                          capture_output=True, text=True, timeout=120)


def test_a_server_that_cannot_bind_is_reported_without_waiting(tmp_path):
    done = serve(tmp_path, "192.0.2.1")  # TEST-NET: no interface here holds it
    assert re.search(r"^pid \d+$", done.stdout, re.M), done.stdout + done.stderr
    assert "Cannot assign requested address" in done.stdout and "port" not in done.stdout
