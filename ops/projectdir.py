"""The project folder on an ssh node is fatpipe's own only when it carries fatpipe's marker.

Before the first push, `claim_project_dir` makes the folder and marks it with the cluster's name
(or adopts an empty one); a folder that holds anything else is refused, never emptied by
`rsync --delete`. `down` removes the folder only when the marker is there, as the login user
(the node profile's applier runs as root and removes nothing of it). See docs/ARCHITECTURE.md,
"The project folder on a node".
"""

from __future__ import annotations

import shlex

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER

from .transport import Transport

TAG = "fatpipe-projectdir:"  # the first word of the answer line the snippets print
# $1 the folder (relative to the login's home, or absolute), $2 the cluster. Values arrive as
# quoted arguments (`set --`), never as script text.
CLAIM = f"""
marker="$1/{PROJECT_MARKER}"
if [ -e "$1" ] || [ -L "$1" ]; then
  [ -d "$1" ] || {{ echo "{TAG} not-a-folder"; exit 0; }}
  if [ -f "$marker" ]; then
    owner=$(head -n 1 -- "$marker")
    [ "$owner" = "$2" ] && {{ echo "{TAG} ours"; exit 0; }}
    echo "{TAG} other $owner"; exit 0
  fi
  [ -z "$(ls -A -- "$1")" ] || {{ echo "{TAG} not-empty"; exit 0; }}
fi
mkdir -p -- "$1" && printf '%s\\n' "$2" > "$marker" && echo "{TAG} made"
"""
REMOVE = f"""
if [ -d "$1" ] && [ -f "$1/{PROJECT_MARKER}" ]; then
  rm -rf -- "$1" && echo "{TAG} removed"
elif [ -e "$1" ] || [ -L "$1" ]; then
  echo "{TAG} kept"
else
  echo "{TAG} absent"
fi
"""


def _run(transport: Transport, script: str, *args: str) -> tuple[str, str]:
    """Run `script` with `args` as $1.. on the node; (its answer word, the rest of the line)."""
    result = transport.run(f"set -- {shlex.join(args)}\n{script}", timeout=60)
    answer = next((line[len(TAG):].split(maxsplit=1) for line in result.stdout.splitlines()
                   if line.startswith(TAG)), None)
    if not result.ok or not answer:
        raise FatpipeError(f"{transport.describe()}: the project folder {args[0]}: {result.reason()}")
    return answer[0], answer[1] if len(answer) > 1 else ""


def claim_project_dir(transport: Transport, folder: str, cluster: str) -> None:
    """Make `folder` fatpipe's (marked with `cluster`) before anything is pushed into it, or raise
    FatpipeError naming the node and the folder when it belongs to someone else."""
    answer, owner = _run(transport, CLAIM, folder, cluster)
    where = f"{transport.describe()}: {folder}"
    if answer == "not-a-folder":
        raise FatpipeError(f"{where} exists and is not a folder; choose another remote_dir for this host")
    if answer == "other":
        raise FatpipeError(f"{where} belongs to cluster {owner!r} (its {PROJECT_MARKER}); "
                           "choose another remote_dir for this cluster")
    if answer == "not-empty":
        raise FatpipeError(f"{where} exists, is not empty and was not made by fatpipe (no {PROJECT_MARKER}); "
                           "nothing was pushed: empty it or choose another remote_dir")


def remove_project_dir(transport: Transport, folder: str) -> str:
    """Remove `folder` on the node if fatpipe made it: `removed`, `kept` (not fatpipe's) or `absent`."""
    return _run(transport, REMOVE, folder)[0]
