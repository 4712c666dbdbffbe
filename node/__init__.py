"""The programs that run on a node, sent there by ops (docs/ARCHITECTURE.md, "The node boundary").

Standard library only, Python 3.8: a node's system Python runs them before any venv exists.
ops reads each as source (`source_file`) and sends it as the program of `python3 -c`, or as a
module loaded beside the node program (`call.py`); the trainer, shipped to the node with this
package beside it, reads the node's environment through `env.py`. A module here imports the
standard library and this package alone, and no module of another layer has its name.
"""

from pathlib import Path

HERE = Path(__file__).parent


def source_file(name: str) -> Path:
    """The file of the node program `name` (a module of this package), as ops sends it."""
    return HERE / f"{name}.py"
