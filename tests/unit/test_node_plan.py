"""Reading terraform's JSON plan for what ends a run on an existing node (stacks/nodeplan.py).

The plans below have the shape `terraform show -json PLANFILE` writes (format 1.2): one resource
change per instance, its actions, the values before and after, what forces a replacement.
tests/system/test_deploy_replace.py and test_aws_emulator.py read real plans of the same changes.
"""

from __future__ import annotations

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.stacks.nodeplan import NodeChange, node_changes, review


def node_name(i: int) -> str:
    return f"lab-{i}"


def rc(address: str, actions: list[str], before=None, after=None, *, reason: str | None = None,
       replace_paths=None, unknown=None, mode: str = "managed") -> dict:
    """One resource change as terraform writes it; type, name and index come from the address."""
    head, _, index = address.partition("[")
    rtype, name = head.split(".")[-2:]
    change = {"actions": actions, "before": before, "after": after, "after_unknown": unknown or {}}
    if replace_paths is not None:
        change["replace_paths"] = replace_paths
    doc = {"address": address, "mode": mode, "type": rtype, "name": name, "change": change}
    if index:
        key = index.rstrip("]")
        doc["index"] = key.strip('"') if key.startswith('"') else int(key)
    if reason:
        doc["action_reason"] = reason
    return doc


def changes(*resource_changes, spared=()) -> list[NodeChange]:
    return node_changes({"format_version": "1.2", "resource_changes": list(resource_changes)}, node_name, spared)


INSTANCE = {"instance_type": "c5n.large", "user_data": "5f1e" * 10, "tags": {"Name": "lab-0"}, "ami": "ami-1"}


def test_a_changed_user_data_replaces_each_instance_and_names_the_attribute_not_its_hash():
    after = {**INSTANCE, "user_data": "9a0b" * 10}
    found = changes(*(rc(f'aws_instance.nodes["lab-{i}"]', ["delete", "create"], INSTANCE, after,
                         reason="replace_because_cannot_update", replace_paths=[["user_data"]]) for i in range(2)))
    assert [(c.node, c.change, c.attributes) for c in found] == [
        ("lab-0", "replace", ("user_data",)), ("lab-1", "replace", ("user_data",))]
    assert "5f1e" not in found[0].describe()


def test_create_before_destroy_is_a_replace_too():
    [found] = changes(rc('digitalocean_droplet.nodes["lab-1"]', ["create", "delete"], {"image": "a"}, {"image": "b"},
                         replace_paths=[["image"]]))
    assert (found.node, found.change, found.attributes) == ("lab-1", "replace", ("image a -> b",))


def test_a_node_no_longer_declared_is_destroyed():
    [found] = changes(rc('aws_instance.nodes["lab-2"]', ["delete"], INSTANCE, None, reason="delete_because_each_key"))
    assert (found.node, found.change, found.attributes) == ("lab-2", "destroy", ("no longer declared",))


@pytest.mark.parametrize("rtype, attribute, old, new", [
    ("aws_instance", "instance_type", "c5n.large", "c5n.xlarge"),
    ("digitalocean_droplet", "size", "c-4", "c-8"),
])
def test_a_machine_type_changed_in_place_is_a_stop_and_start(rtype, attribute, old, new):
    before = {attribute: old, "tags": ["a"]}
    [found] = changes(rc(f'{rtype}.nodes["lab-0"]', ["update"], before, {**before, attribute: new}))
    assert (found.change, found.attributes) == ("stop and start", (f"{attribute} {old} -> {new}",))
    assert found.describe() == f"stop and start ({attribute} {old} -> {new})"


def test_an_attribute_known_only_after_the_apply_counts_as_changed():
    [found] = changes(rc('aws_instance.nodes["lab-0"]', ["update"], INSTANCE, {**INSTANCE, "instance_type": None},
                         unknown={"instance_type": True}))
    assert found.attributes == ("instance_type c5n.large -> (known after apply)",)


@pytest.mark.parametrize("resource_change", [
    # Tags, a security group list: updated in place while the machine runs.
    rc('aws_instance.nodes["lab-0"]', ["update"], INSTANCE, {**INSTANCE, "tags": {"Name": "x"}}),
    rc('digitalocean_droplet.nodes["lab-0"]', ["update"], {"tags": ["a"]}, {"tags": ["b"]}),
    # terraform_data's input alone: no provisioner runs on an update.
    rc("terraform_data.node-0", ["update"], {"input": {"a": 1}}, {"input": {"a": 2}}),
    # A node that is gone (terminated, preempted) is not in the refreshed state: only created.
    rc('aws_instance.nodes["lab-1"]', ["create"], None, INSTANCE),
    rc("terraform_data.node-1", ["create"], None, {"input": {}}),
    rc('aws_instance.nodes["lab-0"]', ["no-op"], INSTANCE, INSTANCE),
    # Not nodes: the cluster's network and firewall.
    rc("aws_security_group.members", ["delete", "create"], {"name": "a"}, {"name": "b"}, replace_paths=[["name"]]),
    rc("digitalocean_firewall.firewall", ["delete"], {"name": "a"}, None),
    rc("data.aws_ssm_parameter.ami", ["read"], None, {}, mode="data"),
    rc("terraform_data.other", ["delete", "create"], {}, {}),
])
def test_what_leaves_every_node_running_needs_no_question(resource_change):
    assert changes(resource_change) == []


def test_a_gone_sim_node_that_fatpipe_asked_to_replace_is_spared():
    gone = rc("terraform_data.node-1", ["delete", "create"], {}, {}, reason="replace_by_request")
    assert changes(gone, spared=("terraform_data.node-1",)) == []
    [found] = changes(gone)  # asked for by anyone else: a replace like any other
    assert (found.node, found.attributes) == ("lab-1", ("asked for",))


def test_terraform_data_nodes_and_hosts_name_the_changed_trigger_keys():
    before = {"triggers_replace": {"tier": "1g", "rate_gbit": 1, "cluster": "lab"}}
    after = {"triggers_replace": {"tier": "10g", "rate_gbit": 10, "cluster": "lab"}}
    found = changes(rc("terraform_data.node-0", ["delete", "create"], before, after, replace_paths=[["triggers_replace"]]),
                    rc("terraform_data.host-3", ["delete", "create"], {"triggers_replace": {"profile": "a" * 64}},
                       {"triggers_replace": {"profile": "b" * 64}}, replace_paths=[["triggers_replace"]]))
    assert [(c.node, c.attributes) for c in found] == [
        ("lab-0", ("rate_gbit 1 -> 10", "tier 1g -> 10g")), ("lab-3", ("profile",))]


def test_a_count_index_is_a_node_number():
    [found] = changes(rc("aws_instance.nodes[1]", ["delete"], INSTANCE, None, reason="delete_because_count_index"))
    assert found.node == "lab-1"


def test_review_asks_only_when_a_node_would_change_and_refuses_without_a_yes():
    asked = []
    review([], "lab", lambda c: asked.append(c) or False)
    assert asked == []
    found = [NodeChange("lab-0", "a", "replace", ("user_data",)), NodeChange("lab-1", "b", "stop and start")]
    review(found, "lab", lambda c: asked.append(c) or True)
    assert asked == [found]
    for approve in (None, lambda c: False):
        with pytest.raises(FatpipeError) as refused:
            review(found, "lab", approve)
        text = str(refused.value)
        assert "\n" not in text and "lab-0, lab-1" in text and "nothing was changed" in text and "--replace" in text


def test_each_node_line_says_what_this_machine_knows_it_holds_and_only_a_terminal_or_replace_says_yes(
        project_dir, monkeypatch, capsys):
    import io
    import json

    from fatpipe.cli.deploying import approve_node_changes
    from fatpipe.infra.project import load_project
    from fatpipe.ops.reach.cluster import Cluster

    (project_dir / "fatpipe.toml").write_text('[clusters.lab]\nprovider = "sim"\nnodes = 2\nisolation = "loopback"\n')
    project = load_project()
    lab = Cluster.resolve(project, "lab")
    found = [NodeChange("lab-0", "a", "stop and start", ("instance_type c5n.large -> c5n.xlarge",)),
             NodeChange("lab-1", "b", "destroy", ("no longer declared",))]
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # piped: never taken for a yes
    assert approve_node_changes(lab, found, replace=False) is False
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["lab-0: stop and start (instance_type c5n.large -> c5n.xlarge); holds: unknown (no run or data push recorded here)",
                     "lab-1: destroy (no longer declared); holds: unknown (no run or data push recorded here)"]

    run = project.state_dir("lab") / "runs" / "20261203-090000-abcd"
    run.mkdir(parents=True)
    (run / "rendezvous.json").write_text("{}")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 41, "loss": 3.0}) + "\n")
    (project.state_dir("lab") / "data").mkdir()
    (project.state_dir("lab") / "data" / "data-manifest.json").write_text(json.dumps({"path": "tokens", "total_bytes": 2_500_000_000}))
    assert approve_node_changes(lab, found, replace=True) is True
    out = capsys.readouterr().out
    assert out.count("holds: 1 run folder(s) (newest 20261203-090000-abcd, step 41; checkpoints and outputs on the nodes), "
                     "staged data tokens (2.50 GB)") == 2, out


@pytest.mark.parametrize("command", ["deploy", "up"])
def test_replace_reaches_the_deploy_of_both_commands(command, project_dir, run_cli, monkeypatch):
    from fatpipe.cli import deploying

    (project_dir / "fatpipe.toml").write_text('[clusters.lab]\nprovider = "sim"\nnodes = 2\nisolation = "loopback"\n')
    answers = []

    def deploy(project, name, **kwargs):
        answers.append(kwargs["approve"]([NodeChange("lab-0", "a", "replace", ("tier 1g -> 10g",))]))
        raise FatpipeError("stop here")

    monkeypatch.setattr(deploying, "deploy_cluster", deploy)  # as the deploy step calls it
    for flags in ([], ["--replace"]):
        result = run_cli(command, "lab", *flags)
        assert "lab-0: replace (tier 1g -> 10g); holds: " in result.output and result.exit_code != 0, result.output
    assert answers == [False, True]
