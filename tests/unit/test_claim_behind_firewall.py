"""A launch's one call lists the firewall and claims the project folder together: on a node whose
listing shows no firewall the claim makes nothing, so a refused node is never prepared
(tests/system/test_firewall.py holds the same on sim nodes)."""

from __future__ import annotations

from fatpipe.node.hostfirewall import SBIN
from fatpipe.ops.reach.asknode import Step, ask
from fatpipe.ops.reach.projectdir import NODE_CHECKS, claim_step
from fatpipe.ops.reach.transport import LocalTransport


def absent_listing() -> Step:
    # A table and chain no host has: the listing shows no firewall, as on a node without one.
    return Step("callsteps.firewall_listing", (SBIN, "fp-absent-table", "FP-ABSENT"), sources=NODE_CHECKS)


def test_a_claim_after_a_listing_without_a_firewall_makes_nothing(tmp_path):
    folder = tmp_path / "project"
    listing, claimed = ask(LocalTransport("n0"), [absent_listing(), claim_step(str(folder), "c", "p1", ("runs",))])
    assert "ok" in listing
    assert claimed["ok"][0] == "no-firewall" and "no firewall" in claimed["ok"][1]
    assert not folder.exists()


def test_without_a_listing_the_claim_makes_the_folder(tmp_path):
    folder = tmp_path / "project"
    [claimed] = ask(LocalTransport("n0"), [claim_step(str(folder), "c", "p1", ("runs",))])
    assert claimed["ok"][0] == "made"
    assert (folder / "runs").is_dir() and (folder / ".fatpipe-project").read_text().split() == ["c", "p1"]


def test_a_refused_launch_takes_back_the_folders_its_claims_made(tmp_path):
    """The verdict came after the call: what the claim made goes, parents it made included, and
    nothing that was there before (nor anything put in a parent since)."""
    node = LocalTransport("n0")
    (tmp_path / "kept").mkdir()
    made = tmp_path / "kept" / "a" / "b" / "project"
    steps = [claim_step(str(made), "c", "p1", ("runs",))]
    claim_then_undo(node, steps)
    assert not (tmp_path / "kept" / "a").exists() and (tmp_path / "kept").is_dir()

    (tmp_path / "kept" / "a").mkdir()
    (tmp_path / "kept" / "a" / "theirs.txt").write_text("x")
    steps = [claim_step(str(made), "c", "p1")]
    claim_then_undo(node, steps)
    assert not (tmp_path / "kept" / "a" / "b").exists() and (tmp_path / "kept" / "a" / "theirs.txt").is_file()


def test_a_folder_that_was_there_is_never_taken_back(tmp_path):
    node = LocalTransport("n0")
    there = tmp_path / "project"
    there.mkdir()
    steps = [claim_step(str(there), "c", "p1")]
    claim_then_undo(node, steps)
    assert there.is_dir() and not any(there.iterdir())  # as empty as it was, never removed


def claim_then_undo(node, steps) -> None:
    """The claims as a command's first call brings them, then the refusal's undo."""
    from fatpipe.ops.reach.asknode import answers_of, remember
    from fatpipe.ops.reach.projectdir import undo_fresh_claims

    remember(node, steps, ask(node, steps))
    try:
        undo_fresh_claims(node)
    finally:
        answers_of(node).forget_all()
