"""The project folder's ownership snippets (`ops.projectdir`) run by real bash, on this machine.

The end-to-end proof over SSH (push refused, `down` keeps or removes) is in test_down_safe.py.
"""

from __future__ import annotations

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import PROJECT_MARKER
from fatpipe.ops.projectdir import claim_project_dir, remove_project_dir
from fatpipe.ops.transport import LocalTransport

NODE = LocalTransport("lab-0")


def test_a_new_folder_is_made_and_marked_with_the_cluster(tmp_path):
    folder = tmp_path / "fatpipe" / "lab"
    claim_project_dir(NODE, str(folder), "lab")
    assert (folder / PROJECT_MARKER).read_text() == "lab\n"
    claim_project_dir(NODE, str(folder), "lab")  # its own folder again: fine
    (folder / "train.py").write_text("x")
    claim_project_dir(NODE, str(folder), "lab")


def test_an_empty_folder_is_adopted(tmp_path):
    claim_project_dir(NODE, str(tmp_path), "lab")
    assert (tmp_path / PROJECT_MARKER).read_text() == "lab\n"


@pytest.mark.parametrize("make,words", [
    (lambda f: (f.mkdir(), (f / "notes.txt").write_text("mine")), "is not empty and was not made by fatpipe"),
    (lambda f: (f.mkdir(), (f / ".hidden").mkdir()), "is not empty and was not made by fatpipe"),
    (lambda f: (f.mkdir(), (f / PROJECT_MARKER).write_text("other\n")), "belongs to cluster 'other'"),
    (lambda f: f.write_text("a file"), "is not a folder"),
])
def test_a_folder_that_is_not_ours_is_refused_and_kept(tmp_path, make, words):
    folder = tmp_path / "home"
    make(folder)
    before = sorted((p.name, p.stat().st_size) for p in tmp_path.rglob("*"))
    with pytest.raises(FatpipeError) as e:
        claim_project_dir(NODE, str(folder), "lab")
    message = str(e.value)
    assert "\n" not in message and "lab-0" in message and str(folder) in message and words in message
    assert sorted((p.name, p.stat().st_size) for p in tmp_path.rglob("*")) == before


def test_values_are_arguments_never_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "a $(touch pwned) `touch pwned2`; b"
    claim_project_dir(NODE, str(folder), "lab; touch pwned3")
    assert (folder / PROJECT_MARKER).read_text() == "lab; touch pwned3\n"
    assert remove_project_dir(NODE, str(folder)) == "removed" and not folder.exists()
    assert not list(tmp_path.glob("pwned*"))


def test_down_removes_only_a_marked_folder(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    claim_project_dir(NODE, str(ours), "lab")
    (ours / "checkpoints").mkdir()
    (ours / "checkpoints" / "step-1.pt").write_text("x")
    theirs.mkdir()
    (theirs / "authorized_keys").write_text("ssh-ed25519 AAAA")
    assert remove_project_dir(NODE, str(theirs)) == "kept"
    assert (theirs / "authorized_keys").read_text() == "ssh-ed25519 AAAA"
    assert remove_project_dir(NODE, str(ours)) == "removed" and not ours.exists()
    assert remove_project_dir(NODE, str(ours)) == "absent"
