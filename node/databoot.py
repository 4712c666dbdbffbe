"""The few lines a node runs as `python3 -c` for the data side: the program itself comes on stdin.

Its first line on the standard input is JSON: the modules (`fatpipe.trainer.staging.*`, their
source), files to write first (relative to the working folder, each written aside then renamed),
the environment to add, the module whose `main(argv)` runs and its argv; with `claim` (the
project folder, the cluster, the project id) the folder is claimed first (`callsteps.claim`,
sent among the modules), its answer said on one line, and the program runs inside it only when
the folder is this project's. Nothing is installed or
left on the node but those files, so the system Python of a fresh node runs it. With `watch`, the
program ends as soon as its standard input does: the operator stopped (Ctrl-C) or is gone.
Standard library only; this file is sent as text, never imported by fatpipe.
"""

import importlib.abc
import importlib.util
import json
import os
import sys
import threading

CLAIMED = "fatpipe-claimed: "  # the claim's answer line, before the program's own output

if __name__ == "__main__":
    SENT = json.loads(sys.stdin.readline())

    class Sent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        """Imports the sent modules first, whatever the node has installed."""

        def find_spec(self, name, path=None, target=None):
            if name in SENT["modules"]:
                return importlib.util.spec_from_loader(name, self, is_package=SENT["modules"][name][0])
            return None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            exec(compile(SENT["modules"][module.__name__][1], f"<fatpipe>/{module.__name__}", "exec"), module.__dict__)

    sys.meta_path.insert(0, Sent())
    if SENT.get("claim"):  # the project folder is this project's before anything is written in it
        answer = importlib.import_module("callsteps").claim(*SENT["claim"])
        print(CLAIMED + json.dumps(answer), flush=True)
        if answer[0] not in ("made", "ours"):
            sys.exit(0)
        os.chdir(SENT["claim"][0])
    for rel, text in SENT["files"].items():
        os.makedirs(os.path.dirname(rel) or ".", exist_ok=True)
        with open(rel + ".tmp", "w") as f:
            f.write(text)
        os.replace(rel + ".tmp", rel)
    os.environ.update(SENT["env"])

    def end_with_stdin():
        while os.read(0, 1 << 16):  # the raw descriptor: no buffer lock held at the program's exit
            pass
        os._exit(143)

    if SENT.get("watch"):
        threading.Thread(target=end_with_stdin, daemon=True).start()
    sys.exit(importlib.import_module(SENT["main"]).main(SENT["argv"]))
