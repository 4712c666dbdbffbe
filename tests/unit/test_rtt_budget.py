"""`max_rtt_ms`: the round trip a cluster's TCP buffers are sized for reaches the user data, the
stack's outputs and what `wait` checks the nodes against; a vm cluster's covers its `rtt_ms`."""

from __future__ import annotations

import json

import pytest

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.outputs import ClusterOutputs
from fatpipe.infra.project import parse_project
from fatpipe.ops.reach.wait import declared_sysctls
from fatpipe.stacks.providers import PROVIDERS

MIB = 1 << 20


def cluster(text: str):
    return next(iter(parse_project(text, "fatpipe.toml").clusters.values()))


@pytest.fixture(autouse=True)
def ssh_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITest test\n")


def aws(extra: str = ""):
    return cluster(f'[clusters.far]\nprovider = "aws"\nregion = "us-east-1"\nssh_cidr = "203.0.113.7/32"\n'
                   f'tier = "1g"\n{extra}\n')


def written_sysctls(user_data: str) -> str:
    doc = json.loads(user_data.split("\n", 1)[1])
    return next(f["content"] for f in doc["write_files"] if f["path"].startswith("/etc/sysctl.d/"))


def test_declared_round_trip_sizes_the_user_datas_buffers():
    near, far = aws(), aws("max_rtt_ms = 100")
    assert (near.rtt_budget_ms, far.rtt_budget_ms) == (10, 100)
    assert f"net.core.rmem_max = {8 * MIB}" in written_sysctls(PROVIDERS["aws"].user_data(near))
    assert f"net.core.rmem_max = {32 * MIB}" in written_sysctls(PROVIDERS["aws"].user_data(far))


def test_outputs_carry_the_budget_and_wait_checks_that_profile():
    node = {"name": "far-0", "private_ip": "10.42.0.10", "public_ip": "198.51.100.4", "transport": "ssh"}
    out = ClusterOutputs.model_validate(aws("max_rtt_ms = 100").output([node]))
    assert out.max_rtt_ms == 100
    assert declared_sysctls(out)["net.ipv4.tcp_rmem"] == f"4096 131072 {32 * MIB}"
    older = ClusterOutputs.model_validate({k: v for k, v in aws().output([node]).items() if k != "max_rtt_ms"})
    assert older.max_rtt_ms == 10 and declared_sysctls(older)["net.core.rmem_max"] == str(8 * MIB)


def test_a_vm_clusters_budget_covers_its_netem_round_trip():
    vm = 'provider = "vm"\nprivate_cidr = "10.93.0.0/24"'
    assert cluster(f"[clusters.v]\n{vm}\nrtt_ms = 50\n").rtt_budget_ms == 50
    assert cluster(f"[clusters.v]\n{vm}\nrtt_ms = 2\n").rtt_budget_ms == 10
    assert cluster(f"[clusters.v]\n{vm}\nrtt_ms = 50\nmax_rtt_ms = 120\n").rtt_budget_ms == 120


@pytest.mark.parametrize("text,message", [
    ('[clusters.s]\nprovider = "sim"\nmax_rtt_ms = 50', "sim nodes have no round trip"),
    ('[clusters.s]\nprovider = "sim"\nmax_rtt_ms = 0', "greater than or equal to 0.1"),
])
def test_bad_budgets_are_one_line_naming_the_key(text, message):
    with pytest.raises(ConfigError) as e:
        cluster(text)
    problems = [line for line in str(e.value).splitlines() if "max_rtt_ms" in line]
    assert len(problems) == 1 and message in problems[0], str(e.value)


def test_a_two_regions_vm_clusters_budget_covers_the_far_pairs():
    text = ('[clusters.v]\nprovider = "vm"\nprivate_cidr = "10.93.0.0/24"\nnodes = 4\nregions = 2\nrtt_ms = 1\n'
            'cross_region_rtt_ms = 80\n')
    assert cluster(text).rtt_budget_ms == 80
