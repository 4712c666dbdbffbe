"""Cloud nodes build the project's node venv during boot (docs/ARCHITECTURE.md, "The node environment").

The user data carries the resolved `[node]` declaration as JSON (`BOOT_ENV_SPEC`: the venv's
stamp, torch, its index, the packages and the requirements file's text) and a fixed stdlib script
(`BOOT_ENV_SCRIPT`). cloud-init starts the script as a transient systemd unit right after the
packages (python3-venv among them) are in, so the GBs of wheels download while the rest of boot
goes on; the ready marker is written only once the script has finished. A build that failed
(its reason in `BOOT_ENV_DONE` and cloud-init's log) does not keep the node from being ready:
launch finds no current venv and builds it as on any ssh node, naming what fails. The script builds
`<login home>/fatpipe/<cluster>/.fatpipe/venv` as the login user, marks the folder as the
cluster's (so launch adopts it) and stamps the venv as launch would: a launch then finds it
current and builds nothing. Every value reaches pip as one argv item, never through a shell.
"""

from __future__ import annotations

import json

from fatpipe.infra.node import DEFAULT_REMOTE_DIR, PROJECT_MARKER, REMOTE_VENV
from fatpipe.infra.nodevenv import STAMP_FILE, node_venv, venv_stamp

BOOT_ENV_SPEC = "/etc/fatpipe/node-env.json"
BOOT_ENV_SCRIPT = "/usr/local/sbin/fatpipe-node-env"
BOOT_ENV_UNIT = "fatpipe-node-env"
BOOT_ENV_DONE = "/var/lib/fatpipe/node-env"  # "ok", or the failure in one line
BOOT_ENV_WAIT_S = 3600  # GBs of CUDA wheels on a slow mirror

SCRIPT_TEXT = """\
#!/usr/bin/env python3
\"\"\"fatpipe: build the project's node venv at boot, as the login user; --wait: until it is done.\"\"\"
import json, os, pathlib, pwd, subprocess, sys, time

DONE = pathlib.Path({done!r})


def build():
    spec = json.loads(pathlib.Path({spec!r}).read_text())
    user = pwd.getpwnam(spec["user"])
    folder = pathlib.Path(user.pw_dir) / spec["workdir"]
    as_user = ["runuser", "-u", spec["user"], "--"]
    env = dict(os.environ, HOME=user.pw_dir, PIP_CONFIG_FILE="/dev/null", PIP_DISABLE_PIP_VERSION_CHECK="1")
    run = lambda argv: subprocess.run(as_user + argv, check=True, env=env, cwd=user.pw_dir)
    run(["mkdir", "-p", str(folder / ".fatpipe")])
    marker = folder / {marker!r}
    if not marker.exists():
        run(["python3", "-c", "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2] + chr(10))",
             str(marker), spec["cluster"]])
    venv, extra = folder / {venv!r}, list(spec["packages"])
    run(["python3", "-m", "venv", "--clear", str(venv)])
    py = str(venv / "bin" / "python")
    index = ["--index-url", spec["index"]] if spec["index"] else []
    run([py, "-m", "pip", "install", "-q", *index, spec["torch"], "numpy"])
    if spec["requirements"] is not None:
        reqs = folder / ".fatpipe" / "boot-requirements.txt"
        run(["python3", "-c", "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])",
             str(reqs), spec["requirements"]])
        extra = ["-r", str(reqs), *extra]
    if extra:
        run([py, "-m", "pip", "install", "-q", *extra])
    run(["python3", "-c", "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2] + chr(10))",
         str(folder / {stamp_file!r}), spec["stamp"]])


def main():
    if sys.argv[1:] == ["--wait"]:
        deadline = time.monotonic() + {wait_s}
        while not DONE.exists() and time.monotonic() < deadline:
            time.sleep(5)
        state = DONE.read_text().strip() if DONE.exists() else "not done within {wait_s} s"
        print("fatpipe node venv:", state, flush=True)
        return 0 if state == "ok" else 1
    DONE.parent.mkdir(parents=True, exist_ok=True)
    try:
        build()
        DONE.write_text("ok\\n")
    except Exception as e:
        DONE.write_text(f"failed: {{type(e).__name__}}: {{e}}\\n")
        return 1
    return 0


sys.exit(main())
"""


def boot_env_spec(project, cluster) -> dict:
    """The resolved declaration the boot script builds from, with the stamp launch checks."""
    venv = node_venv(project, cluster.name, cluster.gpus_per_node)
    requirements = (project.root / venv.requirements).read_text() if venv.requirements else None
    return {"user": cluster.ssh_user, "cluster": cluster.name, "workdir": DEFAULT_REMOTE_DIR.format(cluster=cluster.name),
            "stamp": venv_stamp(project.root, venv), "torch": venv.torch, "index": venv.index,
            "packages": list(venv.packages), "requirements": requirements}


def boot_env_files(project, cluster) -> dict[str, tuple[str, str]]:
    """{path: (content, mode)} for cloud-init's write_files."""
    script = SCRIPT_TEXT.format(done=BOOT_ENV_DONE, spec=BOOT_ENV_SPEC, marker=PROJECT_MARKER, venv=REMOTE_VENV,
                                stamp_file=STAMP_FILE, wait_s=BOOT_ENV_WAIT_S)
    return {BOOT_ENV_SPEC: (json.dumps(boot_env_spec(project, cluster), indent=1) + "\n", "0644"),
            BOOT_ENV_SCRIPT: (script, "0755")}


def boot_env_start() -> list[str]:
    """runcmd's first entry: the build as a transient unit, so the rest of boot does not wait for it."""
    return ["systemd-run", f"--unit={BOOT_ENV_UNIT}", "--description=fatpipe node venv", BOOT_ENV_SCRIPT]


def boot_env_wait() -> list[str]:
    """Before the ready marker: wait for the build to finish (well or not: launch rebuilds a failed one)."""
    return [BOOT_ENV_SCRIPT, "--wait"]
