"""The torch wheel check, with the real pip against a local package index served over HTTP.

The index holds one stand-in torch wheel, for CPython 3.12 on x86_64: the check names it for
that node, and names what is missing for a node with another Python or architecture.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import subprocess
import sys
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.nodevenv import NodeVenv
from fatpipe.ops.env.wheelcheck import IndexUnreachable, torch_wheel

pytestmark = pytest.mark.timeout(600)
WHEEL = "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl"


def write_wheel(path: Path) -> None:
    dist = "torch-2.13.0.dist-info"
    files = {
        "torch/__init__.py": "__version__ = '2.13.0'\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                         "Tag: cp312-cp312-manylinux_2_28_x86_64\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)


@pytest.fixture
def index(tmp_path):
    """A PEP 503 simple index on a free loopback port; its URL."""
    (tmp_path / "simple" / "torch").mkdir(parents=True)
    write_wheel(tmp_path / "simple" / "torch" / WHEEL)
    (tmp_path / "simple" / "torch" / "index.html").write_text(f'<a href="{WHEEL}">{WHEEL}</a>\n')
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()


def test_the_check_names_the_wheel_or_what_is_missing(index):
    venv = NodeVenv("torch==2.13.0", index)
    assert torch_wheel(venv, "3.12", "x86_64") == WHEEL
    with pytest.raises(FatpipeError) as missing:
        torch_wheel(venv, "3.13", "x86_64")
    assert str(missing.value).startswith(f"no wheel for torch==2.13.0 on Python 3.13 x86_64 at {index}: ")
    with pytest.raises(FatpipeError, match="on Python 3.12 aarch64"):
        torch_wheel(venv, "3.12", "aarch64")
    with pytest.raises(FatpipeError, match="no torch wheels are built for the node architecture 'riscv64'"):
        torch_wheel(venv, "3.12", "riscv64")
    with pytest.raises(FatpipeError, match="not a Python version"):
        torch_wheel(venv, "3.12; rm -rf ~", "x86_64")



def test_an_index_that_does_not_answer_is_not_a_missing_wheel():
    """Offline here proves nothing about the nodes: the check says the index did not answer."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/simple"
    with pytest.raises(IndexUnreachable, match=f"the index {url} did not answer"):
        torch_wheel(NodeVenv("torch==2.13.0", url), "3.12", "x86_64")


def test_up_names_a_missing_wheel_before_deploy(index, tmp_path):
    """An AWS cluster declaring a torch the index lacks for the AMI's Python 3.12: `up` stops at the
    wheels phase, in one line, before the deploy phase (no credentials are ever asked for)."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "id.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyForValidationOnly t@t\n")
    (folder / "fatpipe.toml").write_text(f"""\
[clusters.awswheel]
provider = "aws"
region = "us-east-1"
nodes = 2
tier = "10g"
instance_type = "c5n.2xlarge"
ssh_public_key = "{folder / 'id.pub'}"
ssh_cidr = "203.0.113.7/32"

[node]
torch = "torch==2.99.0"
torch_index = "{index}"
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FATPIPE_TORCH"))}
    env["COLUMNS"] = "300"
    up = subprocess.run([sys.executable, "-m", "fatpipe.cli", "up", "awswheel", "--yes", "--", "train.py"],
                        cwd=folder, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert up.returncode != 0, up.stdout[-3000:]
    errors = [line for line in up.stdout.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1 and f"no wheel for torch==2.99.0 on Python 3.12 x86_64 at {index}: " in errors[0], \
        up.stdout[-3000:]
    assert "torch==2.99.0" in errors[0].split(": ", 2)[-1]  # pip's own reason names it too
    assert "wheels: a torch wheel" in up.stdout and "deploy: " not in up.stdout, up.stdout[-3000:]
    assert not (folder / ".fatpipe" / "awswheel" / "outputs.json").exists()
