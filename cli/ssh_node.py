"""Hidden `fatpipe ssh-node apply/revert`: what an ssh cluster's terraform provisioners run.

They run it without a shell and hand it the host as FATPIPE_HOST_* variables (stacks/providers/ssh_stack.py).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import click

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.hostvalues import check_address, check_login, check_node_name, check_path
from fatpipe.infra.node import PROJECT_MARKER
from fatpipe.infra.project import project_id_at
from fatpipe.ops.reach.hostkeys import policy_for
from fatpipe.ops.reach.profile import SshHost, apply_profile, revert_profile
from fatpipe.ops.reach.projectdir import remove_project_dir

ENV_PREFIX = "FATPIPE_HOST_"  # the ssh stack passes every host value as FATPIPE_HOST_<KEY>


def env_option(flag: str, check=None, **kwargs):
    """`--flag`, or FATPIPE_HOST_<FLAG> when the flag is not given; `check` (infra.hostvalues)
    refuses what a hand-edited stack could put there."""
    def callback(ctx, param, value):
        try:
            return check(value) if check and value else value
        except ValueError as e:
            raise click.BadParameter(str(e)) from None

    envvar = ENV_PREFIX + flag.removeprefix("--").replace("-", "_").upper()
    return click.option(flag, envvar=envvar, callback=callback, **kwargs)


PROJECT_FOLDER_NEWS = {  # what `down` did with the project folder, by ops.reach.projectdir's answer
    "removed": "removed the project folder {}",
    "kept": "kept {}: fatpipe did not make it (no " + PROJECT_MARKER + " in it)",
    "other": "kept {}: it belongs to {}, not to this project ({})",
    "absent": "no project folder {} to remove",
}


def check_project_id(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{8}", value):
        raise ValueError(f"{value!r} is not a project id (8 hex digits)")
    return value


def host_options(func):
    """The host as recorded in its terraform_data input; apply and revert take the same set."""
    options = [
        env_option("--name", check_node_name, required=True),
        env_option("--address", check_address, required=True),
        env_option("--port", type=click.IntRange(1, 65535), default=22),
        env_option("--user", check_login, default="root"),
        env_option("--key-file", check_path, default=""),
        env_option("--known-hosts", type=click.Path(path_type=Path), required=True),
        env_option("--private-ip", required=True),
    ]
    for option in reversed(options):
        func = option(func)

    @functools.wraps(func)
    def wrapper(name, address, port, user, key_file, known_hosts, **rest):
        # Machines fatpipe did not make: a key in the user's own known_hosts is the one enforced.
        host = SshHost(name, address, port, user, key_file or None, host_keys=policy_for("ssh"))
        return func(host, known_hosts, **rest)

    return wrapper


@click.group(hidden=True, name="ssh-node")
def ssh_node():
    """Tune and untune one machine of an ssh cluster (run by terraform's local-exec provisioners)."""


@ssh_node.command("apply")
@host_options
def apply(host, known_hosts, private_ip):
    """Apply the node profile in $FATPIPE_NODE_PROFILE to the host."""
    text = os.environ.get("FATPIPE_NODE_PROFILE")
    if not text:
        raise FatpipeError("FATPIPE_NODE_PROFILE is not set (this command is run by the ssh stack)")
    profile = {**json.loads(text), "private_ip": private_ip}
    done = apply_profile(host, profile, known_hosts)
    skipped = done.get("not_applied") or []
    note = f"; the kernel did not take {', '.join(skipped)} here" if skipped else ""
    click.echo(f"{host.where()}: tuned, {done.get('applied', 0)} sysctl(s) applied{note}")


@ssh_node.command("revert")
@host_options
@env_option("--remote-dir", default="", help="The project folder; removed when it carries fatpipe's marker.")
@env_option("--unit", required=True)
@env_option("--cluster", check_node_name, default="", help="The cluster (default: the known_hosts file's folder).")
@env_option("--project-id", check_project_id, default="",
            help="The project whose folder it is (default: this folder's).")
def revert(host, known_hosts, private_ip, remote_dir, unit, cluster, project_id):
    """Undo the node profile on the host and remove fatpipe's files there."""
    done = revert_profile(host, unit, known_hosts)
    click.echo(f"{host.where()}: " + ("handed back as it was" if done.get("reverted") else "nothing to revert"))
    if done.get("firewall_restored") is False:  # someone changed the rules while fatpipe's were there
        click.echo(f"{host.where()}: fatpipe's firewall is removed, but the ruleset differs from the one "
                   "recorded before it (changes made since are kept)")
    if remote_dir:  # as the login user, and only a folder that carries this project's marker
        # The provisioner runs in the project folder (an older stack passes neither value).
        project_id = project_id or project_id_at(Path.cwd(), create=False) or ""
        cluster = cluster or Path(known_hosts).parent.name
        removed, owner = remove_project_dir(host.transport(known_hosts), remote_dir, cluster, project_id)
        click.echo(f"{host.where()}: {PROJECT_FOLDER_NEWS[removed].format(remote_dir, owner, project_id)}")
