"""The project folder on an ssh node is a project's own only when it carries that project's marker.

Before the first push, `claim_project_dir` (Python on the node: node/callsteps.py) makes the folder
and marks it with the cluster's name and the project's id (`.fatpipe/project-id`), or adopts an
empty one; a folder that holds anything else, or another project's marker (two checkouts with a
cluster of the same name on the same hosts), is refused, never pushed into. A marker without a
project id (an earlier fatpipe's) proves nothing of whose the folder is: refused too, naming the
line that makes it this project's. `down` removes the folder only when the marker carries this
project's id, as the login user (the node profile's applier runs as root and removes nothing of it).
See docs/ARCHITECTURE.md, "The project folder on a node".
"""

from __future__ import annotations

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER
from fatpipe.node import source_file

from .asknode import NodeCallError, Step, answer_of, ask, step_value, take_all
from .transport import Transport

NODE_CHECKS_FILE = source_file("callsteps")
NODE_CHECKS = (("callsteps", NODE_CHECKS_FILE),)


def claim_step(folder: str, cluster: str, project_id: str, inside: tuple[str, ...] = ()) -> Step:
    """The node program's step that claims `folder` (node/callsteps.py: `claim`) and,
    once it is this project's, makes the folders `inside` it (relative to it)."""
    return Step("callsteps.claim", (folder, cluster, project_id, *inside), sources=NODE_CHECKS)


def remove_step(folder: str, cluster: str, project_id: str) -> Step:
    return Step("callsteps.remove", (folder, cluster, project_id), sources=NODE_CHECKS)


def undo_fresh_claims(transport: Transport) -> None:
    """A command refused after its first call claimed folders (a node's firewall missing): the
    folders that call made on this node go again, parents it made included; nothing else."""
    for step, answer in take_all(transport, "callsteps.claim"):
        word, top = answer.get("ok") or ("", "")
        if word == "made":
            ask(transport, [Step("callsteps.unclaim", (step.args[0], top, *step.args[1:3]), sources=NODE_CHECKS)])


def _answer(transport: Transport, step: Step) -> tuple[str, str]:
    """(the answer word, the rest) of a claim or removal: brought by the command's first call, or asked."""
    try:
        answer = answer_of(transport, step, timeout=60)
    except NodeCallError as e:
        raise FatpipeError(f"{transport.describe()}: the project folder {step.args[0]}: {e.reason}") from None
    word, rest = step_value(answer, f"the project folder {step.args[0]}", transport)
    return word, rest


def owner_words(rest: str) -> str:
    """`cluster 'lab' of project 1a2b3c4d` from the snippet's `<project> <cluster>` (project `-`:
    an earlier fatpipe's marker, which names the cluster alone)."""
    project, _, cluster = rest.partition(" ")
    return f"cluster {cluster!r}" + (" (marked by an earlier fatpipe)" if project == "-" else f" of project {project}")


def claim_project_dir(transport: Transport, folder: str, cluster: str, project_id: str,
                      inside: tuple[str, ...] = ()) -> str:
    """Make `folder` this project's (marked with `cluster` and `project_id`) before anything is
    pushed into it: `made` or `ours`. Raises FatpipeError naming the node and the folder when it
    belongs to someone else, or its marker names no project."""
    said = _answer(transport, claim_step(folder, cluster, project_id, inside))
    return judge_claim(transport, folder, cluster, project_id, said)


def judge_claim(transport: Transport, folder: str, cluster: str, project_id: str, said: tuple[str, str]) -> str:
    """The claim's answer (`made`, `ours`), or its refusal raised naming the node and folder."""
    answer, rest = said
    where = f"{transport.describe()}: {folder}"
    if answer == "no-firewall":
        raise FatpipeError(f"{where}: {rest}; nothing was pushed")
    if answer == "not-a-folder":
        raise FatpipeError(f"{where} exists and is not a folder; choose another remote_dir for this host")
    if answer == "other" and rest == f"- {cluster[:200]}":  # an earlier fatpipe's marker: whose is unknown
        raise FatpipeError(f"{where} carries a {PROJECT_MARKER} naming cluster {cluster!r} without a project id "
                           "(an earlier fatpipe's), which does not prove it is this project's; nothing was "
                           f"pushed: if it is, add {project_id} as that file's second line, else choose another "
                           "remote_dir")
    if answer == "other":
        raise FatpipeError(f"{where} belongs to {owner_words(rest)} (its {PROJECT_MARKER}), not to this "
                           f"project ({project_id}, cluster {cluster!r}); nothing was pushed: choose another "
                           "remote_dir for this cluster")
    if answer == "not-empty":
        raise FatpipeError(f"{where} exists, is not empty and was not made by fatpipe (no {PROJECT_MARKER}); "
                           "nothing was pushed: empty it or choose another remote_dir")
    return answer


def remove_project_dir(transport: Transport, folder: str, cluster: str, project_id: str) -> tuple[str, str]:
    """Remove `folder` on the node if it is this project's: (`removed`, ""), (`kept`, "") when
    fatpipe did not make it, (`other`, whose words) when another project's, or (`absent`, "")."""
    answer, rest = _answer(transport, remove_step(folder, cluster, project_id))
    return answer, owner_words(rest) if answer == "other" else ""
