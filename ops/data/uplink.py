"""The dataset's one trip over the operator's uplink: rsync to node 0 over the cluster's ssh, resumable.

It runs in the background while the chain starts on every node (the project shipped, torchrun and
torch started, the other nodes hashing what they hold): node 0's rank waits for the word this copy
leaves on node 0 (`ok`, or `failed: why`), so the chain's start-up hides behind the copy instead of
following it. docs/ARCHITECTURE.md, "The data contract".
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
import uuid
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.trainer.staging.hashcache import CACHE_SUFFIX
from fatpipe.trainer.staging.manifest import (
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    RECORD_NAME,
    manifest_target,
)

from .check import MANIFEST_DIR

RERUN = "run the push again: it resumes"


class UplinkCopy:
    """rsync of the source to node 0 (`--partial`: resumable; `--checksum`: a matching file is skipped,
    a corrupted one of the right size and time is not), then the manifest beside it, then the word."""

    def __init__(self, t, workdir: str, source: Path, manifest: dict, local_manifest: Path):
        self.t, self.workdir, self.source, self.manifest = t, workdir, source, manifest
        self.local_manifest = local_manifest
        # Under the node's manifest folder: the project sync never ships nor deletes it (datacheck).
        self.ready_rel = f"{MANIFEST_DIR}/source-ready-{uuid.uuid4().hex[:12]}"
        self.proc: subprocess.Popen | None = None
        self.error: FatpipeError | None = None
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._finish, daemon=True)

    def start(self, log) -> None:
        self.log, self.started = log, time.monotonic()
        dest = f"{self.workdir}/{self.manifest['path']}"
        parent = dest.rsplit("/", 1)[0]
        made = self.t.run(f"mkdir -p -- {shlex.quote(parent)}", timeout=60)
        if not made.ok:
            raise FatpipeError(f"{self.t.describe()}: cannot make {parent}: {made.reason()}")
        folder = self.manifest["kind"] == "folder"
        src = f"{self.source}/" if folder else str(self.source)
        # Random data does not compress: --no-z saves the CPU; the manifest, the hash cache, the
        # record of what was staged and the chain's partial copies stay out of it; a link is never
        # copied (the manifest refuses one, --no-links keeps one made since out). No --delete.
        extra = ["--no-z", "--checksum", "--no-links", f"--exclude={MANIFEST_NAME}", f"--exclude=*{PARTIAL_SUFFIX}",
                 f"--exclude=*{CACHE_SUFFIX}", f"--exclude={RECORD_NAME}"]
        argv = self.t.rsync_argv(src, f"{self.t.remote_host()}:{dest}{'/' if folder else ''}", extra)
        # A session of its own, as every transport command: Ctrl-C reaches fatpipe, which stops it.
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.thread.start()

    def _finish(self) -> None:
        _, err = self.proc.communicate()
        try:
            if self.proc.returncode:
                raise FatpipeError(f"{self.t.describe()}: copying the data failed: "
                                   f"{err.strip()[-300:] or f'rsync exit {self.proc.returncode}'} ({RERUN})")
            self._place_manifest()
            self.seconds = time.monotonic() - self.started
            self._say("ok")
            self.log(f"{self.t.node_name}: uplink copy done ({self.seconds:.1f} s)")
        except FatpipeError as e:
            self.error = e
            self._say(f"failed: {e}")

    def _place_manifest(self) -> None:
        """Node 0's copy of the manifest, beside its data (the chain writes the others' copies)."""
        rel = manifest_target(self.manifest, Path(".")).as_posix()
        done = self.t.copy_to(str(self.local_manifest), f"{self.workdir}/{rel}", ["--no-z"], timeout=120)
        if not done.ok:
            raise FatpipeError(f"{self.t.describe()}: writing the manifest failed: {done.reason()}")

    def _say(self, word: str) -> None:
        """Leave the word for node 0's rank: written aside, then renamed, so it is read whole."""
        path = f"{self.workdir}/{self.ready_rel}"
        self.t.run(f"mkdir -p -- {shlex.quote(path.rsplit('/', 1)[0])} && printf '%s\\n' {shlex.quote(word)} > "
                   f"{shlex.quote(path + '.tmp')} && mv -f -- {shlex.quote(path + '.tmp')} {shlex.quote(path)}",
                   timeout=60)

    def failed(self) -> FatpipeError | None:
        """The copy's error once it ended with one (None while it runs or when it succeeded)."""
        return None if self.thread.is_alive() else self.error

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.thread.join(timeout=60)

    def wait(self) -> float:
        """The copy's seconds once it is done; its error if it failed."""
        self.thread.join()
        if self.error:
            raise self.error
        return self.seconds
