"""The project folder on an ssh node is a project's own only when it carries that project's marker.

Before the first push, `claim_project_dir` makes the folder and marks it with the cluster's name
and the project's id (`.fatpipe/project-id`), or adopts an empty one; a folder that holds
anything else, or another project's marker (two checkouts with a cluster of the same name on the
same hosts), is refused, never pushed into. A marker an earlier fatpipe wrote (the cluster's name
alone) is adopted once, and the caller says so. `down` removes the folder only when the marker is
this project's, as the login user (the node profile's applier runs as root and removes nothing of
it). See docs/ARCHITECTURE.md, "The project folder on a node".
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER

from .transport import Transport

TAG = "fatpipe-projectdir:"  # the first word of the answer line the snippets print
# $1 the folder (relative to the login's home, or absolute), $2 the cluster, $3 the project id.
# Values arrive as quoted arguments (`set --`), never as script text. The marker: the cluster's
# name on its first line, the project's id on its second (none: written by an earlier fatpipe).
# `owner` answers the marker's project (`-`: none) and cluster for `other`.
READ = f"""
marker="$1/{PROJECT_MARKER}"
owner() {{ p=$(sed -n 2p -- "$marker" | tr -d ' ' | head -c 64); echo "{TAG} $1 ${{p:--}} $(head -n 1 -- "$marker" | head -c 200)"; }}
mine() {{ [ "$(head -n 1 -- "$marker")" = "$2" ] && [ "$(sed -n 2p -- "$marker")" = "$3" ]; }}
legacy() {{ [ "$(head -n 1 -- "$marker")" = "$2" ] && [ -z "$(sed -n 2p -- "$marker")" ]; }}
"""
CLAIM = READ + f"""
write() {{ printf '%s\\n%s\\n' "$2" "$3" > "$marker.tmp" && mv -f -- "$marker.tmp" "$marker"; }}
if [ -e "$1" ] || [ -L "$1" ]; then
  [ -d "$1" ] || {{ echo "{TAG} not-a-folder"; exit 0; }}
  if [ -f "$marker" ]; then
    mine "$@" && {{ echo "{TAG} ours"; exit 0; }}
    legacy "$@" && write "$@" && {{ echo "{TAG} adopted"; exit 0; }}
    owner other "$@"; exit 0
  fi
  [ -z "$(ls -A -- "$1")" ] || {{ echo "{TAG} not-empty"; exit 0; }}
fi
mkdir -p -- "$1" && write "$@" && echo "{TAG} made"
"""
REMOVE = READ + f"""
if [ -d "$1" ] && [ -f "$marker" ]; then
  if mine "$@" || legacy "$@"; then rm -rf -- "$1" && echo "{TAG} removed"; else owner other "$@"; fi
elif [ -e "$1" ] || [ -L "$1" ]; then
  echo "{TAG} kept"
else
  echo "{TAG} absent"
fi
"""


def answer_of(stdout: str) -> tuple[str, str] | None:
    """(the snippet's answer word, the rest of its line) from a command's output; None: no answer."""
    answer = next((line[len(TAG):].split(maxsplit=1) for line in stdout.splitlines() if line.startswith(TAG)), None)
    return (answer[0], answer[1] if len(answer) > 1 else "") if answer else None


def _run(transport: Transport, script: str, *args: str) -> tuple[str, str]:
    """Run `script` with `args` as $1.. on the node; (its answer word, the rest of the line)."""
    result = transport.run(f"set -- {shlex.join(args)}\n{script}", timeout=60)
    answer = answer_of(result.stdout)
    if not result.ok or not answer:
        raise FatpipeError(f"{transport.describe()}: the project folder {args[0]}: {result.reason()}")
    return answer


def claim_then(folder: str, cluster: str, project_id: str, command: str) -> str:
    """Shell text that claims `folder` as `claim_project_dir` does, says the answer, and runs
    `command` inside it only when the folder is this project's: the claim and the work in one
    round trip (`judge_claim` reads the answer)."""
    return (f"set -- {shlex.join([folder, cluster, project_id])}\nclaim=$( ( {CLAIM} ) )\n"
            'printf \'%s\\n\' "$claim"\n'
            f'case "$claim" in "{TAG} made"|"{TAG} ours"|"{TAG} adopted") cd -- "$1" && {command} ;; esac\n')


def owner_words(rest: str) -> str:
    """`cluster 'lab' of project 1a2b3c4d` from the snippet's `<project> <cluster>` (project `-`:
    an earlier fatpipe's marker, which names the cluster alone)."""
    project, _, cluster = rest.partition(" ")
    return f"cluster {cluster!r}" + (" (marked by an earlier fatpipe)" if project == "-" else f" of project {project}")


def claim_project_dir(transport: Transport, folder: str, cluster: str, project_id: str) -> str:
    """Make `folder` this project's (marked with `cluster` and `project_id`) before anything is
    pushed into it: `made`, `ours`, or `adopted` (an earlier fatpipe's marker of this cluster,
    now this project's: the caller says so once). Raises FatpipeError naming the node and the
    folder when it belongs to someone else."""
    answer, rest = _run(transport, CLAIM, folder, cluster, project_id)
    return judge_claim(transport, folder, cluster, project_id, (answer, rest))


def judge_claim(transport: Transport, folder: str, cluster: str, project_id: str, said: tuple[str, str]) -> str:
    """The claim's answer (`made`, `ours`, `adopted`), or its refusal raised naming the node and folder."""
    answer, rest = said
    where = f"{transport.describe()}: {folder}"
    if answer == "not-a-folder":
        raise FatpipeError(f"{where} exists and is not a folder; choose another remote_dir for this host")
    if answer == "other":
        raise FatpipeError(f"{where} belongs to {owner_words(rest)} (its {PROJECT_MARKER}), not to this "
                           f"project ({project_id}, cluster {cluster!r}); nothing was pushed: choose another "
                           "remote_dir for this cluster")
    if answer == "not-empty":
        raise FatpipeError(f"{where} exists, is not empty and was not made by fatpipe (no {PROJECT_MARKER}); "
                           "nothing was pushed: empty it or choose another remote_dir")
    return answer


def adopted_line(transport: Transport, folder: str, cluster: str, project_id: str) -> str:
    """What to say once when `claim_project_dir` adopted an earlier fatpipe's folder."""
    return (f"{transport.describe()}: {folder} was marked for cluster {cluster!r} without a project id "
            f"(by an earlier fatpipe, or at the node's boot): it is project {project_id}'s from now on")


def claim_and_say(transport: Transport, folder: str, cluster: str, project_id: str,
                  log: Callable[[str], None] | None) -> None:
    """`claim_project_dir`, and the one line to `log` when it adopted an earlier fatpipe's folder."""
    if claim_project_dir(transport, folder, cluster, project_id) == "adopted" and log:
        log(adopted_line(transport, folder, cluster, project_id))


def remove_project_dir(transport: Transport, folder: str, cluster: str, project_id: str) -> tuple[str, str]:
    """Remove `folder` on the node if it is this project's: (`removed`, ""), (`kept`, "") when
    fatpipe did not make it, (`other`, whose words) when another project's, or (`absent`, "")."""
    answer, rest = _run(transport, REMOVE, folder, cluster, project_id)
    return answer, owner_words(rest) if answer == "other" else ""
