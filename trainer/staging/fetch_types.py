"""What `trainer.staging.fetch` and its sources share: one remote file, and the error a node reports."""

from __future__ import annotations

from dataclasses import dataclass

READ_SIZE = 1 << 20  # bytes per read and write: memory stays bounded whatever the file size


class FetchError(Exception):
    """A problem retrying will not fix; its text is the node's one-line report."""


@dataclass(frozen=True)
class Remote:
    """One file of the source: its name in the manifest, how the source finds it, size and ETag."""

    name: str
    key: str  # the S3 key, or the URL
    size: int
    etag: str
