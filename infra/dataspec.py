"""The `[data]` table of fatpipe.toml: a dataset every node gets, where it comes from and where it lands.

A local file or folder (staged from this machine), or a remote source every node fetches itself:
`s3://bucket/prefix` (every object under it) or `https://host/file` (`http://` only with
`insecure_http = true`). Project-wide (`[data]`) or per cluster (`[clusters.<name>.data]`, which
wins). docs/ARCHITECTURE.md, "The data contract", says where the data and its manifest land on a
node.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from pydantic import Field, StrictBool, model_validator

from .trainspec import Strict

MANIFEST_NAME = ".fatpipe-manifest.json"  # beside the data on every node (inside a staged folder)
LOCAL_MANIFEST = "data-manifest.json"  # the operator's copy, in .fatpipe/<cluster>/
CHUNK_SIZE = 64 << 20  # bytes per chunk: what the fan-out sends and what a node may lack alone
REMOTE_SCHEMES = ("s3://", "https://", "http://")
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # S3's bucket naming rules
REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+)+")
REMOTE_ONLY = ("endpoint_url", "region", "ca_bundle", "insecure_http", "anonymous")
UNSAFE = "*?[]\\"  # rsync's pattern characters: the path becomes an exclude pattern


class DataSpec(Strict):
    """A local file or folder, or a remote source, landing in the project folder of every node at `path`."""

    source: str = Field(min_length=1)
    path: str | None = None  # relative to the project folder on a node; default: the source's own
    chunk_mib: int = Field(CHUNK_SIZE >> 20, ge=1, le=1024)
    # Remote sources only. Credentials never appear here: a node uses its own (environment,
    # ~/.aws, instance role), or none with `anonymous` (a public bucket).
    endpoint_url: str | None = None  # an S3-compatible store (MinIO, R2, ...); default: AWS
    region: str | None = None
    ca_bundle: str | None = None  # a PEM file here, shipped to the nodes: a server's private CA
    insecure_http: StrictBool = False  # allow an http:// source (no TLS: anyone on the path can alter it)
    anonymous: StrictBool = False  # unsigned S3 requests: a public bucket

    @property
    def remote(self) -> bool:
        return self.source.startswith(REMOTE_SCHEMES)

    @model_validator(mode="after")
    def _source_and_path(self) -> DataSpec:
        if "://" in self.source:
            remote_source(self)
        else:
            given = [key for key in REMOTE_ONLY if key in self.model_fields_set]
            if given:
                raise ValueError(f"{given[0]} applies to an s3:// or https:// source only, not to the local "
                                 f"source {self.source!r}")
        if self.path is None and self.remote:
            raise ValueError(f"source {self.source!r} is remote: give path = \"...\", where it lands in every "
                             "node's project folder (for example \"data/train\")")
        if self.path is None:
            outside = self.source.startswith("~") or Path(self.source).is_absolute() or \
                ".." in PurePosixPath(self.source).parts
            if outside:
                raise ValueError(f"source {self.source!r} lies outside the project folder: give path = \"...\", "
                                 "where it lands in every node's project folder (for example \"data/train\")")
            self.path = self.source
        self.path = landing_path(self.path)
        return self

    @property
    def chunk_size(self) -> int:
        return self.chunk_mib << 20

    def ca_bundle_path(self, project_root: Path) -> Path | None:
        """The CA bundle on this machine (relative to the project folder), if one is given."""
        return (Path(project_root) / Path(self.ca_bundle).expanduser()).resolve() if self.ca_bundle else None

    def source_path(self, project_root: Path) -> Path:
        """The source on this machine (a relative one is relative to the project folder)."""
        return (Path(project_root) / Path(self.source).expanduser()).resolve()


def remote_source(spec: DataSpec) -> None:
    """ValueError, in one line, for a remote source or key fatpipe does not fetch safely."""
    source = spec.source
    if not source.startswith(REMOTE_SCHEMES):
        raise ValueError(f"source {source!r}: only s3://, https:// (and http:// with insecure_http = true) "
                         "are fetched; a local source is a path")
    if any(c.isspace() or not c.isprintable() for c in source):
        raise ValueError(f"source {source!r} holds spaces or control characters")
    parts = urlsplit(source)
    if parts.username or parts.password:
        raise ValueError(f"source {source!r} holds credentials; a node uses its own (environment, "
                         "~/.aws, instance role), never ones written in fatpipe.toml")
    if parts.scheme == "s3":
        if not BUCKET.fullmatch(parts.netloc):
            raise ValueError(f"source {source!r}: {parts.netloc!r} is not an S3 bucket name "
                             "(3-63 lowercase letters, digits, . and -)")
        if parts.query or parts.fragment:
            raise ValueError(f"source {source!r}: an S3 source is s3://bucket/prefix, without ? or #")
    else:
        if parts.scheme == "http" and not spec.insecure_http:
            raise ValueError(f"source {source!r} is plain http: anyone on the path can alter the data; use "
                             "https://, or set insecure_http = true to accept that")
        if not parts.hostname or not parts.path.strip("/") or parts.path.endswith("/"):
            raise ValueError(f"source {source!r}: an http(s) source names one file, https://host/path/file")
        if spec.anonymous or spec.endpoint_url or spec.region:
            raise ValueError(f"source {source!r}: endpoint_url, region and anonymous apply to s3:// sources only")
    if spec.endpoint_url is not None:
        endpoint = urlsplit(spec.endpoint_url)
        if endpoint.scheme not in ("https", "http") or not endpoint.hostname or endpoint.username \
                or endpoint.password or endpoint.query:
            raise ValueError(f"endpoint_url {spec.endpoint_url!r}: give a URL such as https://s3.example.com")
        if endpoint.scheme == "http" and not spec.insecure_http:
            raise ValueError(f"endpoint_url {spec.endpoint_url!r} is plain http; use https://, or set "
                             "insecure_http = true to accept that")
    if spec.region is not None and not REGION.fullmatch(spec.region):
        raise ValueError(f"region {spec.region!r} is not a region name such as \"us-east-1\"")


def landing_path(path: str) -> str:
    """`path` normalised, or ValueError when it would leave the project folder or name nothing."""
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise ValueError(f"path {path!r} must be relative to the project folder on the nodes, not absolute")
    parts = [p for p in pure.parts if p != "."]
    if not parts or ".." in parts:
        what = "names no file" if not parts else "leaves the project folder (..)"
        raise ValueError(f"path {path!r} {what}; give a path inside it such as \"data/train\"")
    odd = sorted({c for c in path if c in UNSAFE or not c.isprintable()})
    if odd:
        raise ValueError(f"path {path!r} holds {''.join(odd)!r}; use letters, digits and . _ - / (rsync reads "
                         "the rest as patterns)")
    if parts[0] in (".fatpipe", ".git"):
        raise ValueError(f"path {path!r} lies in {parts[0]}/, which fatpipe or git own; choose another folder")
    return "/".join(parts)


def cluster_data(spec, cluster_name: str) -> DataSpec | None:
    """The dataset a cluster gets: its own `[clusters.<name>.data]`, else the project's `[data]`."""
    cluster = spec.clusters.get(cluster_name)
    own = getattr(cluster, "data", None) if cluster is not None else None
    return own or getattr(spec, "data", None)
