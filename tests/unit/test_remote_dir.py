"""An ssh host's `remote_dir`: `down` removes it, so it may never be the home, `/` or a system folder."""

from __future__ import annotations

import pytest

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.node import DEFAULT_REMOTE_DIR, remote_dir_problem
from fatpipe.infra.project import parse_project

FIELD = "clusters.r.hosts.0.remote_dir"

REFUSED = [
    "", " ", ".", "./", "./.", "~", "~/", "~/fatpipe/lab", "~root/x", "/", "//", "/srv", "/srv/", "//srv",
    "/home/ubuntu", "/root", "/etc", "/fatpipe", "/var/lib/fatpipe", "..", "../x", "a/../b", "fatpipe/lab/..",
    "/mnt/fatpipe/../etc", "/mnt/fatpipe/lab/..", "-rf", "--delete", "lab\nx", "lab\tx", "fatpipe", "fatpipe/",
]
ALLOWED = ["fatpipe/lab", "work", "data/fatpipe-x", "./work", "a b/c", ".cache/fatpipe-lab",
           "/mnt/nvme/fatpipe/lab", "/fatpipe/lab", "/home/ubuntu/fatpipe/lab", "/data/fatpipe/a/b"]


def parse(remote_dir: str):
    toml_value = remote_dir.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return parse_project(
        f'[clusters.r]\nprovider = "ssh"\ntier = "1g"\n[[clusters.r.hosts]]\naddress = "203.0.113.10"\n'
        f'private_ip = "10.0.0.10"\nremote_dir = "{toml_value}"\n', "fatpipe.toml").clusters["r"]


@pytest.mark.parametrize("value", REFUSED)
def test_a_folder_down_must_not_remove_is_one_line_naming_the_field(value):
    with pytest.raises(ConfigError) as e:
        parse(value)
    problems = [line for line in str(e.value).splitlines() if "clusters.r" in line]
    assert len(problems) == 1 and f" {FIELD}: " in problems[0], str(e.value)
    assert "relative to the login's home" in problems[0] or "below it" in problems[0]


@pytest.mark.parametrize("value", ALLOWED)
def test_folders_of_its_own_are_allowed(value):
    assert parse(value).hosts[0].remote_dir == value


def test_the_default_folder_follows_the_rule():
    assert remote_dir_problem(DEFAULT_REMOTE_DIR.format(cluster="lab")) is None
    assert parse_project('[clusters.r]\nprovider = "ssh"\ntier = "1g"\n[[clusters.r.hosts]]\naddress = "h"\n'
                         'private_ip = "10.0.0.10"\n', "f").clusters["r"].hosts[0].remote_dir is None
