"""The project folder's ownership snippets (`ops.reach.projectdir`) run by real bash, on this machine.

The end-to-end proofs over SSH (push refused, `down` keeps or removes; two projects on the same
hosts) are in test_down_safe.py and test_node_folder.py.
"""

from __future__ import annotations

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER
from fatpipe.ops.reach.projectdir import claim_project_dir, remove_project_dir
from fatpipe.ops.reach.transport import LocalTransport

NODE = LocalTransport("lab-0")
OURS, THEIRS = "0a1b2c3d", "9f8e7d6c"


def test_a_new_folder_is_made_and_marked_with_the_cluster_and_the_project(tmp_path):
    folder = tmp_path / "fatpipe" / "lab"
    assert claim_project_dir(NODE, str(folder), "lab", OURS) == "made"
    assert (folder / PROJECT_MARKER).read_text() == f"lab\n{OURS}\n"
    assert claim_project_dir(NODE, str(folder), "lab", OURS) == "ours"  # its own folder again: fine
    (folder / "train.py").write_text("x")
    assert claim_project_dir(NODE, str(folder), "lab", OURS) == "ours"


def test_an_empty_folder_is_adopted(tmp_path):
    assert claim_project_dir(NODE, str(tmp_path), "lab", OURS) == "made"
    assert (tmp_path / PROJECT_MARKER).read_text() == f"lab\n{OURS}\n"


@pytest.mark.parametrize("make,words", [
    (lambda f: (f.mkdir(), (f / "notes.txt").write_text("mine")), "is not empty and was not made by fatpipe"),
    (lambda f: (f.mkdir(), (f / ".hidden").mkdir()), "is not empty and was not made by fatpipe"),
    (lambda f: (f.mkdir(), (f / PROJECT_MARKER).write_text("other\n")),
     "belongs to cluster 'other' (marked by an earlier fatpipe)"),
    (lambda f: (f.mkdir(), (f / PROJECT_MARKER).write_text("lab\n")),  # an earlier fatpipe's: not proof
     "naming cluster 'lab' without a project id (an earlier fatpipe's)"),
    (lambda f: (f.mkdir(), (f / PROJECT_MARKER).write_text(f"lab\n{THEIRS}\n")),
     f"belongs to cluster 'lab' of project {THEIRS} (its {PROJECT_MARKER}), not to this project ({OURS}, "
     "cluster 'lab')"),
    (lambda f: (f.mkdir(), (f / PROJECT_MARKER).write_text(f"other\n{OURS}\n")),
     f"belongs to cluster 'other' of project {OURS}"),
    (lambda f: (f.mkdir(), (f / PROJECT_MARKER).write_text("lab\nsome thing else\n")),
     "belongs to cluster 'lab' of project something"),
    (lambda f: f.write_text("a file"), "is not a folder"),
])
def test_a_folder_that_is_not_ours_is_refused_and_kept(tmp_path, make, words):
    folder = tmp_path / "home"
    make(folder)
    before = sorted((p.name, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*"))
    with pytest.raises(FatpipeError) as e:
        claim_project_dir(NODE, str(folder), "lab", OURS)
    message = str(e.value)
    assert "\n" not in message and "lab-0" in message and str(folder) in message and words in message
    assert sorted((p.name, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*")) == before


def test_values_are_arguments_never_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "a $(touch pwned) `touch pwned2`; b"
    claim_project_dir(NODE, str(folder), "lab; touch pwned3", OURS)
    assert (folder / PROJECT_MARKER).read_text() == f"lab; touch pwned3\n{OURS}\n"
    assert remove_project_dir(NODE, str(folder), "lab; touch pwned3", OURS) == ("removed", "")
    assert not folder.exists()
    assert not list(tmp_path.glob("pwned*"))


def test_down_removes_only_this_projects_folder(tmp_path):
    ours, theirs, other, legacy = (tmp_path / name for name in ("ours", "theirs", "other", "legacy"))
    claim_project_dir(NODE, str(ours), "lab", OURS)
    (ours / "checkpoints").mkdir()
    (ours / "checkpoints" / "step-1.pt").write_text("x")
    theirs.mkdir()
    (theirs / "authorized_keys").write_text("ssh-ed25519 AAAA")
    claim_project_dir(NODE, str(other), "lab", THEIRS)
    legacy.mkdir()
    (legacy / PROJECT_MARKER).write_text("lab\n")
    assert remove_project_dir(NODE, str(theirs), "lab", OURS) == ("kept", "")
    assert (theirs / "authorized_keys").read_text() == "ssh-ed25519 AAAA"
    assert remove_project_dir(NODE, str(other), "lab", OURS) == ("other", f"cluster 'lab' of project {THEIRS}")
    assert (other / PROJECT_MARKER).is_file()
    assert remove_project_dir(NODE, str(ours), "lab", OURS) == ("removed", "") and not ours.exists()
    assert remove_project_dir(NODE, str(ours), "lab", OURS) == ("absent", "")
    # An earlier fatpipe's marker of this cluster carries no project id: no proof, kept.
    assert remove_project_dir(NODE, str(legacy), "lab", OURS) == ("other", "cluster 'lab' (marked by an earlier fatpipe)")
    assert (legacy / PROJECT_MARKER).read_text() == "lab\n"
