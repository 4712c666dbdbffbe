"""On node 0: serve the wheel folder on its private address while the other nodes install from it
(ops/env/venvs.py).

Standard library only, Python 3.8, sent as the program of `python3 -c` from the project folder with
the folder, the address and the wait as arguments. The server (`http.server` on a free port) runs in
a session of its own, its output in `<folder>.serve.log`, its stdin and this command's pipes closed
to it so the command ends while it serves; the program prints `pid <its process group>`, then the
server's log once it names its port (or the wait is over).
"""

import subprocess
import sys
import time


def serve(folder, address, wait_s):
    log = folder + ".serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-u", "-m", "http.server", "0", "--bind", address, "--directory", folder],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and server.poll() is None and " port " not in _text(log):
        time.sleep(0.2)
    print(f"pid {server.pid}")
    print(_text(log), end="")


def _text(path):
    with open(path, errors="replace") as f:
        return f.read()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], float(sys.argv[3]))
