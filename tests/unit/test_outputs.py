"""The outputs reader: the three shapes of docs/ARCHITECTURE.md, and a clear error for anything else."""

from __future__ import annotations

import copy
import json

import pytest

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.outputs import parse_outputs, read_outputs

BARE = {
    "name": "us-east", "provider": "aws", "region": "us-east-1", "tier_gbps": 10,
    "private_cidr": "10.42.0.0/24", "ssh_user": "ubuntu", "gpus_per_node": 0, "rdzv_port": 29400,
    "nodes": [
        {"name": "us-east-0", "public_ip": "54.1.2.3", "private_ip": "10.42.0.10", "transport": "ssh"},
        {"name": "us-east-1", "public_ip": "54.1.2.4", "private_ip": "10.42.0.11", "transport": "ssh"},
    ],
}
SHAPES = {
    "bare": BARE,
    "terraform-output-json": {"cluster": {"value": BARE, "type": ["object", {}], "sensitive": False}},
    "cdktf-outputs-file": {"us-east": {"cluster": BARE}},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_reads_the_same(shape, tmp_path):
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(SHAPES[shape]))
    outputs = read_outputs(path)
    assert outputs.name == "us-east" and len(outputs.nodes) == 2
    assert outputs.rdzv_endpoint == "10.42.0.10:29400"


def test_cdktf_file_with_several_stacks_needs_a_name():
    doc = {"a": {"cluster": BARE}, "b": {"cluster": {**BARE, "name": "b"}}}
    with pytest.raises(FatpipeError, match="several stacks"):
        parse_outputs(doc)
    assert parse_outputs(doc, "b").name == "b"


def broken(mutate):
    doc = copy.deepcopy(BARE)
    mutate(doc)
    return doc


@pytest.mark.parametrize(
    "doc, message",
    [
        (broken(lambda d: d["nodes"][0].pop("private_ip")), "nodes.0.private_ip: required but missing"),
        (broken(lambda d: d.update(nodes=[])), "no nodes"),
        (broken(lambda d: d["nodes"][1].update(private_ip="10.42.0.10")), "share private_ip 10.42.0.10"),
        (broken(lambda d: d["nodes"][0].update(private_ip="fd00::1")), "IPv6 address; an IPv4 address is required"),
        (broken(lambda d: d["nodes"][0].update(transport="telnet")), "nodes.0.transport"),
        (broken(lambda d: d["nodes"][0].pop("public_ip")), "no public_ip"),
        ({"something": "else"}, "no `cluster` output"),
    ],
)
def test_bad_outputs_are_named(doc, message):
    with pytest.raises(FatpipeError, match=message.replace("(", r"\(")):
        parse_outputs(doc)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FatpipeError, match="deploy the cluster first"):
        read_outputs(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(FatpipeError, match="not JSON"):
        read_outputs(tmp_path / "bad.json")
