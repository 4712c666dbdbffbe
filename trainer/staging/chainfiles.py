"""The files one rank of the staging chain (`stage`) writes into and reads from: partial copies,
each a new inode (a file held wrong is copied and patched, never written in place), opened without
following a link in the dataset folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fatpipe.trainer.staging.manifest import PARTIAL_SUFFIX, file_target
from fatpipe.trainer.staging.names import dataset_base, open_nofollow, writable_target


class Files:
    """The partial copies this rank writes into, open for the whole chain."""

    def __init__(self, manifest: dict, root: Path):
        self.manifest, self.root, self.open = manifest, root, {}

    def partial(self, f: int):
        if f not in self.open:
            entry = self.manifest["files"][f]
            base = dataset_base(self.manifest, self.root)
            target = writable_target(base, file_target(self.manifest, self.root, entry["name"]))
            part = writable_target(base, target.with_name(target.name + PARTIAL_SUFFIX))
            if target.is_file():  # what it holds was hashed from here: patch a copy, a new inode
                part.unlink(missing_ok=True)
                shutil.copyfile(target, part)
            handle = open_nofollow(part, os.O_RDWR | os.O_CREAT)
            handle.truncate(entry["size"])
            self.open[f] = handle
        return self.open[f]

    def read(self, task, into: memoryview) -> None:
        """A chunk this rank holds (`task`: a `stage.Task`): from its open partial copy, else from
        the file (or its partial copy)."""
        handle = self.open.get(task.file)
        if handle is None:
            target = file_target(self.manifest, self.root, self.manifest["files"][task.file]["name"])
            path = target if target.is_file() else target.with_name(target.name + PARTIAL_SUFFIX)
            with open_nofollow(path, os.O_RDONLY) as f:
                f.seek(task.offset)
                f.readinto(into)
            return
        handle.seek(task.offset)
        handle.readinto(into)

    def close(self) -> None:
        for handle in self.open.values():
            handle.close()
