"""A PEP 503 index over local wheel files that counts what it serves: the stand-in for PyPI that
the node-wheels test and bench/first_step.py measure the bytes over the operator's link with."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from packaging.utils import canonicalize_name, parse_wheel_filename


class CountingIndex:
    """A PEP 503 index over `files`, on `host`: which files it served, and how many bytes."""

    def __init__(self, files: Path, root: Path, host: str):
        for wheel in files.glob("*.whl"):
            project = root / "simple" / canonicalize_name(parse_wheel_filename(wheel.name)[0])
            project.mkdir(parents=True, exist_ok=True)
            (project / wheel.name).symlink_to(wheel)
            with open(project / "index.html", "a") as page:
                page.write(f'<a href="{wheel.name}">{wheel.name}</a>\n')
        self.served: Counter[str] = Counter()
        self.bytes = 0
        index = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = unquote(self.path.rsplit("/", 1)[-1].split("#")[0])
                if name.endswith(".whl"):
                    index.served[name] += 1
                    index.bytes += (files / name).stat().st_size
                super().do_GET()

        self.server = ThreadingHTTPServer((host, 0), functools.partial(Handler, directory=str(root)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{host}:{self.server.server_address[1]}/simple"
