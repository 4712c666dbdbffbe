"""Host values of an ssh cluster never become shell text or options: refused, or passed as argv/env.

A corpus of hostile values goes into every field of the cluster file: each is refused with one
line naming the field, or stays inert (it reaches ssh as one argument after `--`, or the node
as environment). The ssh-node command the provisioners run reads the host from FATPIPE_HOST_*.
"""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.project import parse_project
from fatpipe.ops.reach import transport as transport_module
from fatpipe.ops.reach.transport import (
    SshTransport,
    control_dir,
    is_private_dir,
    private_control_dir,
)

HOSTILE = [
    "$(touch /tmp/fp-pwned)", "`touch /tmp/fp-pwned`", "a; touch /tmp/fp-pwned", "a && touch x",
    "a|touch x", "-oProxyCommand=touch /tmp/fp-pwned", "-F/dev/null", "a b", "a\nb", "'a'", '"a"',
    "a>x", "${HOME}", "%{x}", "a@b", "ssh://evil", "",
]


def ssh_cluster(host: dict, **cluster) -> str:
    """A one-host ssh cluster file, every value written as TOML basic strings (escaped)."""
    def toml(value):
        if isinstance(value, int):
            return str(value)
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    host = {"address": "203.0.113.10", "private_ip": "10.0.0.10", **host}
    lines = ["[clusters.r]", 'provider = "ssh"', 'tier = "1g"']
    lines += [f"{key} = {toml(value)}" for key, value in cluster.items()]
    lines += ["[[clusters.r.hosts]]"] + [f"{key} = {toml(value)}" for key, value in host.items()]
    return "\n".join(lines) + "\n"


def refusal(text: str) -> str | None:
    """The one problem line naming the key, or None when the file is accepted."""
    try:
        parse_project(text, "fatpipe.toml")
    except ConfigError as e:
        problems = [line for line in str(e).splitlines() if "clusters.r" in line]
        assert len(problems) == 1, str(e)
        return problems[0]
    return None


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("where,key", [("host", "address"), ("host", "user"), ("host", "name"),
                                       ("cluster", "ssh_user")])
def test_hostile_addresses_logins_and_names_are_refused_naming_the_field(where, key, value):
    text = ssh_cluster({key: value}) if where == "host" else ssh_cluster({}, **{key: value})
    line = refusal(text)
    assert line is not None, f"{key} = {value!r} was accepted"
    assert key in line and "\n" not in line


@pytest.mark.parametrize("key,value", [
    ("address", "203.0.113.10"), ("address", "2001:db8::7"), ("address", "vps2.example.net"),
    ("address", "gpu_box"), ("user", "ubuntu"), ("user", "deploy.bot"), ("name", "gpu-0.lab"),
])
def test_ordinary_values_are_accepted(key, value):
    assert refusal(ssh_cluster({key: value})) is None


@pytest.mark.parametrize("value", ["~/keys/my key", "$(touch /tmp/fp-pwned)", "`x`", "-oProxyCommand=x"])
def test_a_key_path_may_hold_anything_but_control_characters(value):
    # Accepted: it reaches ssh as the one argument after -i (and the provisioner as environment).
    assert refusal(ssh_cluster({}, ssh_key_file=value)) is None
    line = refusal(ssh_cluster({}, ssh_key_file=value + "\n"))
    assert line is not None and "ssh_key_file" in line


@pytest.mark.parametrize("value", ["22; touch x", "$(echo 22)", "-p22", -1, 0, 70000])
def test_a_port_is_a_number_in_range(value):
    line = refusal(ssh_cluster({"port": value}))
    assert line is not None and "port" in line


def test_ssh_and_rsync_never_read_the_host_as_an_option(tmp_path, monkeypatch):
    monkeypatch.setattr(transport_module, "control_dir", lambda: tmp_path)
    t = SshTransport("n0", "-oProxyCommand=touch x", tmp_path / "known_hosts", user="u", port=22,
                     identity="/keys/my key")
    argv = t.argv("true")
    assert argv[-3:] == ["--", "-oProxyCommand=touch x", "bash -c true"]
    assert argv[argv.index("-i") + 1] == "/keys/my key"
    seen = []
    monkeypatch.setattr(transport_module, "_run", lambda argv, timeout, stdin_text=None: seen.append(argv)
                        or transport_module.Result(0, "", ""))
    t.pull("runs/x", tmp_path / "back")
    six = SshTransport("n1", "2001:db8::7", tmp_path / "known_hosts")
    six.pull("runs/x", tmp_path / "back")
    for argv, host in zip(seen, ("-oProxyCommand=touch x", "[2001:db8::7]"), strict=True):
        assert argv[0] == "rsync" and argv[-3:] == ["--", f"{host}:runs/x/", f"{tmp_path / 'back'}/"]
        assert "s" in argv[1]  # the remote path goes through rsync's protocol, not the node's shell


@pytest.mark.parametrize("value, interval", [(None, "15"), ("4", "4"), (" 600 ", "600"), ("0", None),
                                             ("601", None), ("1.5", None), ("5; touch x", None), ("\u00b2", None)])
def test_the_keepalive_is_whole_seconds_from_the_environment(tmp_path, monkeypatch, value, interval):
    """ssh gives a quiet connection up after 4 unanswered probes, every 15 s unless
    FATPIPE_SSH_ALIVE_S says otherwise; anything but 1-600 whole seconds is a one-line error."""
    monkeypatch.setattr(transport_module, "control_dir", lambda: tmp_path)
    if value is None:
        monkeypatch.delenv("FATPIPE_SSH_ALIVE_S", raising=False)
    else:
        monkeypatch.setenv("FATPIPE_SSH_ALIVE_S", value)
    t = SshTransport("n0", "10.0.0.1", tmp_path / "known_hosts")
    if interval is None:
        with pytest.raises(FatpipeError, match="FATPIPE_SSH_ALIVE_S must be a whole number of seconds"):
            t.argv("true")
        return
    argv = t.argv("true")
    assert f"ServerAliveInterval={interval}" in argv and "ServerAliveCountMax=4" in argv


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The temp dir fatpipe sees, private to this test; no control-dir override."""
    monkeypatch.delenv("FATPIPE_SSH_CONTROL_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    private_control_dir.cache_clear()
    yield tmp_path
    private_control_dir.cache_clear()


def test_the_control_dir_is_made_private(temp_dir):
    path = control_dir()
    assert path == temp_dir / f"fatpipe-ssh-{os.getuid()}" and is_private_dir(path)
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0 and control_dir() == path


def test_a_premade_control_dir_others_may_write_is_not_used(temp_dir):
    planted = temp_dir / f"fatpipe-ssh-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    path = control_dir()
    assert path != planted and is_private_dir(path) and path.parent == temp_dir
    assert control_dir() == path  # one private folder per process, reused


def test_a_link_in_place_of_the_control_dir_is_not_used(temp_dir):
    target = temp_dir / "elsewhere"
    target.mkdir(mode=0o700)
    (temp_dir / f"fatpipe-ssh-{os.getuid()}").symlink_to(target)
    assert control_dir() not in (target, temp_dir / f"fatpipe-ssh-{os.getuid()}")


def test_a_control_dir_owned_by_another_user_is_not_used(temp_dir, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    planted = temp_dir / "theirs"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)
    monkeypatch.setenv("FATPIPE_SSH_CONTROL_DIR", str(planted))
    path = control_dir()
    assert path != planted and is_private_dir(path)


def test_ssh_node_takes_the_host_from_the_environment(monkeypatch, tmp_path):
    from fatpipe.cli.main import cli

    seen = {}
    monkeypatch.setattr("fatpipe.ops.reach.profile.revert_profile",
                        lambda host, unit, known: seen.update(host=host, unit=unit) or {})
    monkeypatch.setattr("fatpipe.ops.reach.projectdir.remove_project_dir",
                        lambda transport, folder, cluster, project: seen.update(
                            remove=folder, owner=(cluster, project)) or ("absent", ""))
    env = {"FATPIPE_HOST_NAME": "r-0", "FATPIPE_HOST_ADDRESS": "203.0.113.10", "FATPIPE_HOST_PORT": "2222",
           "FATPIPE_HOST_USER": "ubuntu", "FATPIPE_HOST_KEY_FILE": str(tmp_path / "$(touch x) key"),
           "FATPIPE_HOST_KNOWN_HOSTS": str(tmp_path / "kh"), "FATPIPE_HOST_PRIVATE_IP": "10.0.0.10",
           "FATPIPE_HOST_REMOTE_DIR": "fatpipe/$(touch x)", "FATPIPE_HOST_UNIT": "fatpipe-net.service",
           "FATPIPE_HOST_CLUSTER": "r", "FATPIPE_HOST_PROJECT_ID": "0a1b2c3d"}
    done = CliRunner().invoke(cli, ["ssh-node", "revert"], env=env)
    assert done.exit_code == 0, done.output
    host = seen["host"]
    assert (host.name, host.address, host.port, host.user) == ("r-0", "203.0.113.10", 2222, "ubuntu")
    assert host.key_file == str(tmp_path / "$(touch x) key") and seen["remove"] == "fatpipe/$(touch x)"
    assert seen["owner"] == ("r", "0a1b2c3d")  # down removes the folder only when it is this project's
    bad = CliRunner().invoke(cli, ["ssh-node", "revert"], env={**env, "FATPIPE_HOST_ADDRESS": "-oProxyCommand=x"})
    assert bad.exit_code == 2 and "--address" in bad.output
    bad = CliRunner().invoke(cli, ["ssh-node", "revert"], env={**env, "FATPIPE_HOST_PROJECT_ID": "$(id)"})
    assert bad.exit_code == 2 and "--project-id" in bad.output


@pytest.mark.parametrize("node,cluster_user", [
    ({"ssh_host": "-oProxyCommand=touch x"}, ""), ({"ssh_host": "$(touch x)"}, ""),
    ({"ssh_user": "`id`"}, ""), ({}, "-oProxyCommand=x"),
])
def test_an_outputs_file_cannot_smuggle_a_host_value_either(node, cluster_user):
    from fatpipe.infra.outputs import parse_outputs

    doc = {"name": "c", "provider": "ssh", "tier_gbps": 1, "private_cidr": "10.0.0.0/24", "ssh_user": cluster_user,
           "nodes": [{"name": "c-0", "private_ip": "10.0.0.10", "transport": "ssh", "public_ip": "203.0.113.10",
                      **node}]}
    with pytest.raises(Exception, match="not a (host name|login name)"):
        parse_outputs(doc)


def test_a_cloud_login_is_checked_too(tmp_path):
    key = tmp_path / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyForSynthesisOnly test@fatpipe\n")
    text = (f'[clusters.r]\nprovider = "aws"\nregion = "us-east-1"\nssh_cidr = "198.51.100.7/32"\n'
            f'ssh_public_key = "{key}"\nssh_user = "-oProxyCommand=x"\n')
    line = refusal(text)
    assert line is not None and "ssh_user" in line
