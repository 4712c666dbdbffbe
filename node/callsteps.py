"""On a node: the project folder's marker and the firewall's listing, read by Python (the node program's steps).

Standard library only, Python 3.8; run by `call.py` (ops/reach/asknode.py) from the
command's starting folder, the login's home on an ssh node. Values (folders, names) arrive as
arguments, never as program text. What the answers mean is ops/reach/projectdir.py's and
firewall_check.py's.
"""

import os
import shutil
import subprocess

PROJECT_MARKER = ".fatpipe-project"  # infra.node.PROJECT_MARKER (a test holds them equal)


def _marker_lines(folder):
    """(first line, second line) of the folder's marker, as `head -n 1` and `sed -n 2p` read them."""
    with open(os.path.join(folder, PROJECT_MARKER), errors="replace") as f:
        lines = f.read().split("\n")
    return lines[0], lines[1] if len(lines) > 1 else ""


def _owner(folder):
    """`other <project or -> <cluster>`: whose marker it is, for the one-line refusal."""
    cluster, project = _marker_lines(folder)
    return ["other", f"{project.replace(' ', '')[:64] or '-'} {cluster[:200]}"]


def _mine(folder, cluster, project_id):
    """The marker names this cluster and this project's id: the only proof that fatpipe made the
    folder for this project (a marker without an id, an earlier fatpipe's, proves neither)."""
    return bool(project_id) and _marker_lines(folder) == (cluster, project_id)


def _write(folder, cluster, project_id):
    marker = os.path.join(folder, PROJECT_MARKER)
    with open(marker + ".tmp", "w") as f:
        f.write(f"{cluster}\n{project_id}\n")
    os.replace(marker + ".tmp", marker)


def claim(folder, cluster, project_id, *inside):
    """[answer, rest]: made (with the top-most folder it made), ours, not-a-folder, not-empty,
    other (with whose: an earlier fatpipe's marker without a project id too), or no-firewall (a
    listing in this call showed none: nothing is made); a folder claimed (made, ours) gets the
    folders `inside` it that the pushes fill."""
    if _no_firewall:
        return ["no-firewall", _no_firewall[0]]
    answer = _claim(folder, cluster, project_id)
    if answer[0] in ("made", "ours"):
        for sub in inside:
            os.makedirs(os.path.join(folder, sub), exist_ok=True)
    return answer


def _claim(folder, cluster, project_id):
    if os.path.lexists(folder):
        if not os.path.isdir(folder):
            return ["not-a-folder", ""]
        if os.path.isfile(os.path.join(folder, PROJECT_MARKER)):
            if _mine(folder, cluster, project_id):
                return ["ours", ""]
            return _owner(folder)
        if os.listdir(folder):
            return ["not-empty", ""]
    # The top-most folder this claim makes ("": the folder was there, empty, and stays).
    top = "" if os.path.lexists(folder) else folder
    while top and not os.path.lexists(os.path.dirname(os.path.abspath(top))):
        top = os.path.dirname(os.path.abspath(top))
    os.makedirs(folder, exist_ok=True)
    _write(folder, cluster, project_id)
    return ["made", top]


def unclaim(folder, top, cluster, project_id):
    """Undo a claim that made `folder` (and its parents up to `top`; "": it only filled an empty
    folder that was there): what it made goes if the folder is still this project's, then each
    parent it made while it is empty. `remove`'s answer."""
    if not top:  # as empty as it was: what is in it goes, the folder (or its link) stays
        if not (os.path.isfile(os.path.join(folder, PROJECT_MARKER)) and _mine(folder, cluster, project_id)):
            return ["kept", ""]
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        return ["removed", ""]
    answer = remove(folder, cluster, project_id)
    if answer[0] == "removed":
        parent, top = os.path.abspath(folder), os.path.abspath(top)
        while parent != top and parent.startswith(top + os.sep):
            parent = os.path.dirname(parent)
            try:
                os.rmdir(parent)
            except OSError:  # something else is in it now: kept
                break
    return answer


def remove(folder, cluster, project_id):
    """[answer, rest]: removed (its marker carries this project's id), kept (not fatpipe's), other
    (another project's, or a marker without a project id), or absent."""
    if os.path.isdir(folder) and os.path.isfile(os.path.join(folder, PROJECT_MARKER)):
        if not _mine(folder, cluster, project_id):
            return _owner(folder)
        if os.path.islink(folder):  # as `rm -rf -- folder` does: the link, not what it points to
            os.unlink(folder)
        else:
            shutil.rmtree(folder)
        return ["removed", ""]
    return ["kept" if os.path.lexists(folder) else "absent", ""]


def size(rel):
    """[bytes, ""] of `rel` (a file or folder, links not followed inside it) in this folder, as
    `du -sb` counts them; [None, why (the whole line)] when it is not there or resolves (links followed) outside
    this folder: a pull refuses it before any copy."""
    root, real = os.path.realpath("."), os.path.realpath(rel)
    if not os.path.exists(real):
        return [None, f"cannot pull {rel}: realpath: {rel}: No such file or directory"]
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        return [None, f"{rel} resolves to {real}, outside the project folder {root}; not pulled"]
    total = os.lstat(real).st_size
    for folder, dirs, files in os.walk(real):
        total += sum(os.lstat(os.path.join(folder, name)).st_size for name in dirs + files)
    return [total, ""]


# What this program's firewall listings showed: a claim that follows one in the same call makes
# nothing on a node the listing shows without a firewall (the operator then refuses the node).
_no_firewall = []


def firewall_listing(sbin, table, chain):
    """{rc, out, err} of listing the nft table, else the iptables chains (root, or `sudo -n`)."""
    listed = _list_firewall(sbin, table, chain)
    if not (f"table inet {table}" in listed["out"] or f"-N {chain}" in listed["out"]):
        _no_firewall.append(f"no firewall: neither table inet {table} nor chain {chain} is there")
    return listed


def _list_firewall(sbin, table, chain):
    env = dict(os.environ, PATH=f"{os.environ.get('PATH', '')}:{sbin}")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if shutil.which("nft", path=env["PATH"]):
        commands = [[*sudo, "nft", "list", "table", "inet", table]]
    else:
        commands = [[*sudo, "iptables", "-w", "-S", "INPUT"], [*sudo, "iptables", "-w", "-S", chain]]
    out, err, rc = "", "", 0
    for argv in commands:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
        except FileNotFoundError as e:
            return {"rc": 127, "out": out, "err": err + f"{e.filename}: command not found\n"}
        out, err, rc = out + done.stdout, err + done.stderr, done.returncode
        if rc:
            break
    return {"rc": rc, "out": out, "err": err}


def readiness(ready_file, under_root, names, mark):
    """What `wait` reads of a node, as ops/reach/wait.py's probe prints it (`parse_probe` reads
    it): reachable, the ready marker's text (none: no-marker), each sysctl from /proc/sys.
    `under_root`: the marker lies below $FATPIPE_ROOT, the node's own (a sim node that shares its
    host's files gets it in its sessions)."""
    if under_root:
        ready_file = os.environ.get("FATPIPE_ROOT", "") + ready_file
    lines = [f"{mark} reachable"]
    try:
        with open(ready_file, errors="replace") as f:
            lines += [f"{mark} marker", f.read()]
    except OSError:
        lines.append(f"{mark} no-marker")
    for name in names:
        try:
            with open("/proc/sys/" + name.replace(".", "/"), errors="replace") as f:
                value = f.read().strip()
        except OSError:
            value = ""
        lines.append(f"{mark} sysctl {name} {value}")
    return "\n".join(lines) + "\n"
