"""On a node: one program that answers a command's checks in one round trip (ops/reach/asknode.py).

Standard library only, Python 3.8. `asknode.ask` sends this file as the program of
`python3 -c`, with the node-side modules the request needs loaded beside it and the request as a
JSON literal: a list of steps, each `{"call": "module.function", "args": [...], "cwd": folder}`
(`cwd` relative to where the command started, the login's home on an ssh node). Every step runs,
in order; its answer is `{"ok": value}` or `{"error": "Type: message"}`, so one failing check
never hides the others. The answers travel back as one JSON line after MARK.
"""

import json
import os
import subprocess
import sys
import types

MARK = "FATPIPE_NODECALL "


def load(name, text):
    """Make `text` the module `name`, as an import would (node-side modules import each other by name)."""
    module = types.ModuleType(name)
    module.__file__ = name + ".py"
    sys.modules[name] = module
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module


def make_dirs(*folders):
    """Every folder (and its parents), as `mkdir -p` would; the ones already there are kept."""
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
    return True


def read_line(path):
    """The first line of the file `path` (no newline), or None when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return f.readline().rstrip("\n")
    except OSError:
        return None


def read_from(path, offset):
    """The text of the file `path` from byte `offset` on, or None when it is not there."""
    try:
        with open(path, "rb") as f:
            f.seek(int(offset))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return None


def run_python(python, program, timeout):
    """{rc, out, err} of `python -c program` (the run's interpreter, which may not be this one)."""
    try:
        done = subprocess.run([python, "-c", program], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return {"rc": 127, "out": "", "err": f"{python}: not found"}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "out": "", "err": f"{python}: no answer within {timeout} s"}
    return {"rc": done.returncode, "out": done.stdout, "err": done.stderr}


def run_step(step):
    module, _, function = step["call"].rpartition(".")
    target = getattr(sys.modules[module] if module else sys.modules[__name__], function)
    return target(*step.get("args", []))


def serve(request):
    """Run every step of `request`; print the answers after MARK."""
    home = os.getcwd()
    answers = []
    for step in request:
        try:
            os.chdir(home)
            if step.get("cwd"):
                os.chdir(step["cwd"])
            answers.append({"ok": run_step(step)})
        except BaseException as e:  # one step's failure is its answer, never the others' loss
            answers.append({"error": f"{type(e).__name__}: {e}"})
        finally:
            sys.stdout.flush()
    os.chdir(home)
    print(MARK + json.dumps(answers), flush=True)
