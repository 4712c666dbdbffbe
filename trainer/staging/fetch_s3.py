"""An s3:// source for `trainer.staging.fetch`: every object under a prefix (or the one object it names),
listed with size and ETag, read from an offset by a ranged GET pinned to that ETag.

boto3 on the node, with the node's own credentials (its environment, ~/.aws, instance role), or
unsigned requests with `anonymous`; `endpoint_url` and `region` reach S3-compatible stores.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit

from ..lazy import load
from .fetch_types import READ_SIZE, FetchError, Remote


def s3_client(spec: dict, root: Path):
    try:  # boto3 is optional on the node, and loads only for an s3:// source
        boto3, botocore = load("boto3"), load("botocore")
        config_type = load("botocore.config").Config
    except ImportError:
        raise FetchError(f"boto3 is not installed for {sys.executable}: add \"boto3\" to [node] packages "
                         "(the node venv) or install it for that Python") from None
    config = config_type(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=30, read_timeout=60)
    if spec.get("anonymous"):
        config = config.merge(config_type(signature_version=botocore.UNSIGNED))
    ca = spec.get("ca_bundle")
    # A session of its own: the default one keeps the credentials it found first.
    return boto3.session.Session().client("s3", endpoint_url=spec.get("endpoint_url"),
                                          region_name=spec.get("region"), verify=str(root / ca) if ca else None,
                                          config=config)


class S3Source:
    def __init__(self, spec: dict, root: Path):
        parts = urlsplit(spec["source"])
        self.source, self.bucket, self.prefix = spec["source"], parts.netloc, parts.path.lstrip("/")
        self.client = s3_client(spec, root)

    def _call(self, what: str, fn, **kwargs):
        errors = load("botocore.exceptions")
        try:
            return fn(Bucket=self.bucket, **kwargs)
        except errors.NoCredentialsError:
            raise FetchError("no AWS credentials on this node (its environment, ~/.aws or an instance role); "
                             "a public bucket: set anonymous = true") from None
        except errors.ClientError as e:
            error = e.response.get("Error", {})
            raise FetchError(f"{what}: {error.get('Code', '?')} ({error.get('Message', '').strip()})") from None

    def listing(self) -> tuple[str, list[Remote]]:
        folder = self.prefix if not self.prefix or self.prefix.endswith("/") else self.prefix + "/"
        found, token = [], None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self._call(self.source, self.client.list_objects_v2, Prefix=folder, **extra)
            found += [Remote(o["Key"][len(folder):], o["Key"], o["Size"], o["ETag"])
                      for o in page.get("Contents", []) if not o["Key"].endswith("/")]
            token = page.get("NextContinuationToken")
            if not token:
                break
        if found:
            return "folder", sorted(found, key=lambda r: r.name)
        head = self._head(self.prefix) if folder != self.prefix else None  # s3://bucket/key: one object
        if head is not None:
            return "file", [Remote(self.prefix.rsplit("/", 1)[-1], self.prefix, head["ContentLength"],
                                   head["ETag"])]
        raise FetchError(f"{self.source}: no objects there")

    def _head(self, key: str) -> dict | None:
        try:
            return self._call(self.source, self.client.head_object, Key=key)
        except FetchError as e:
            if ": 404 (" in str(e) or "NoSuchKey" in str(e) or "NotFound" in str(e):
                return None
            raise

    def read(self, remote: Remote, offset: int):
        """(offset, an iterator of blocks): a ranged GET that fails if the object changed since listed."""
        reply = self._call(f"s3://{self.bucket}/{remote.key}", self.client.get_object, Key=remote.key,
                           Range=f"bytes={offset}-", IfMatch=remote.etag)
        return offset, reply["Body"].iter_chunks(READ_SIZE)
