"""A node's project folder is claimed, and removed by `down`, only when its marker carries this
project's id: an earlier fatpipe's marker (the cluster's name alone) proves neither whose the
folder is nor that fatpipe made it, so it is never adopted and never removed (the node program
runs as on a node: node/callsteps.py through the node call)."""

from __future__ import annotations

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER
from fatpipe.ops.reach.asknode import ask
from fatpipe.ops.reach.projectdir import claim_step, judge_claim, remove_step
from fatpipe.ops.reach.transport import LocalTransport

NODE = LocalTransport("lab-0")
OURS = "0a1b2c3d"


def answer(step) -> list[str]:
    [said] = ask(NODE, [step])
    return said["ok"]


def folder_marked(tmp_path, marker: str):
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / PROJECT_MARKER).write_text(marker)
    (folder / "ckpt.pt").write_text("a run's")
    return folder


@pytest.mark.parametrize("marker", ["lab\n", "lab", "lab\n\n"])
def test_an_earlier_fatpipes_marker_of_the_same_cluster_is_neither_adopted_nor_removed(tmp_path, marker):
    folder = folder_marked(tmp_path, marker)
    assert answer(claim_step(str(folder), "lab", OURS)) == ["other", "- lab"]
    assert answer(remove_step(str(folder), "lab", OURS)) == ["other", "- lab"]
    assert answer(remove_step(str(folder), "lab", "")) == ["other", "- lab"]  # no id here: no proof either
    assert (folder / PROJECT_MARKER).read_text() == marker and (folder / "ckpt.pt").read_text() == "a run's"
    with pytest.raises(FatpipeError) as refused:
        judge_claim(NODE, str(folder), "lab", OURS, ("other", "- lab"))
    line = str(refused.value)
    assert "\n" not in line and "without a project id" in line and f"add {OURS} as that file's second line" in line

