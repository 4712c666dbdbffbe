"""The outputs contract (docs/ARCHITECTURE.md): the typed `cluster` output, read from any shape a user may have."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .clusters import PROVIDERS
from .errors import FatpipeError
from .hostvalues import (
    CONTROL,
    check_address,
    check_login,
    check_node_name,
    check_path,
    one_host_problem,
)
from .spec import DEFAULT_MAX_RTT_MS, NAME_PATTERN

# The nccl map becomes environment variables in a file bash sources with `set -a`
# (ops/rdzv/nodefiles.py) and lines of /etc/nccl.conf: only NCCL's and gloo's own names.
NCCL_NAME = re.compile(r"(NCCL|GLOO)_[A-Z0-9_]+")


def _ipv4(value: str, what: str) -> str:
    """One machine's IPv4 address: never one that binds every interface, nor a group's."""
    try:
        ip = ipaddress.IPv4Address(value)
    except ValueError:
        kind = "an IPv6 address" if ":" in str(value) else "not an IP address"
        raise ValueError(f"{what} {value!r} is {kind}; an IPv4 address is required") from None
    problem = one_host_problem(ip)
    if problem:
        raise ValueError(f"{what} {problem}")
    return str(ip)


class NodeOutput(BaseModel):
    """One node: how to reach it, and its address on the private network."""

    model_config = ConfigDict(extra="ignore")

    name: str
    private_ip: str
    public_ip: str | None = None
    transport: Literal["ssh", "netns", "local"]
    netns: str | None = None  # transport netns: the namespace
    ssh_host: str | None = None  # transport ssh: what ssh dials (a name or IP), else public_ip
    ssh_user: str | None = None  # transport ssh: this node's login, else the cluster's ssh_user
    ssh_port: int | None = Field(None, ge=1, le=65535)
    ssh_key_file: str | None = None  # transport ssh: the private key to log in with (a path here)
    remote_dir: str | None = None  # transport ssh: the project folder there (default ~/fatpipe/<cluster>)
    ready_file: str | None = None  # sim nodes: the ready marker on this machine (else the node's own)
    # Clouds: the machine's id; another id under the same name is a recreated node (its old host
    # key is forgotten), and AWS reads its host keys from the console by it (ops/reach/hostkeys.py).
    instance_id: str | None = Field(None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    # The region the node was declared in (clusters across regions: an AWS region, a sim or vm
    # region "r0", "r1"...); None on one region. netcheck's measured grouping is checked against it.
    region: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")

    @field_validator("private_ip")
    @classmethod
    def _private_ipv4(cls, value: str) -> str:
        return _ipv4(value, "private_ip")

    @field_validator("public_ip")
    @classmethod
    def _public_ipv4(cls, value: str | None) -> str | None:
        return _ipv4(value, "public_ip") if value else None

    # What ssh dials and logs in as, from a file a user may edit: the model's rules (infra/hostvalues.py).
    _ssh_host = field_validator("ssh_host")(lambda value: value and check_address(value))
    _ssh_user = field_validator("ssh_user")(lambda value: value and check_login(value))
    # A node's name is echoed, names folders here (pulls, logs) and on the node; netns reaches
    # `ip netns exec`: the cluster file's rule for node names holds both.
    _name = field_validator("name")(check_node_name)
    _netns = field_validator("netns")(lambda value: value and check_node_name(value))
    _paths = field_validator("ssh_key_file", "ready_file", "remote_dir")(lambda value: value and check_path(value))

    @model_validator(mode="after")
    def _transport_has_its_address(self) -> NodeOutput:
        if self.transport == "ssh" and not (self.public_ip or self.ssh_host):
            raise ValueError(f"node {self.name} uses transport ssh but has no public_ip or ssh_host")
        if self.transport == "netns" and not self.netns:
            raise ValueError(f"node {self.name} uses transport netns but names no netns")
        return self


class ClusterOutputs(BaseModel):
    """The `cluster` output every stack has: what deploy hands to every later step."""

    model_config = ConfigDict(extra="ignore")

    name: str
    provider: str  # one of the cluster file's providers (checked below)
    region: str = ""
    tier_gbps: int = Field(gt=0)
    private_cidr: str
    ssh_user: str = ""
    gpus_per_node: int = Field(0, ge=0)
    rdzv_port: int = Field(29400, ge=1, le=65535)
    max_rtt_ms: float = Field(DEFAULT_MAX_RTT_MS, gt=0)  # the round trip the nodes' buffers are sized for
    # Clusters across regions: the declared rate between regions (the sim's and vm's shaped
    # link), which netcheck judges cross-region pairs against; None where unknown or one region.
    cross_region_gbps: float | None = Field(None, gt=0)
    isolation: Literal["netns", "loopback"] | None = None  # sim clusters: what `auto` resolved to
    nccl: dict[str, str] = Field(default_factory=dict)  # NCCL_* settings the nodes' runs get
    # Machines fatpipe did not make: whether their host firewall is on (launch checks it, or
    # warns when the cluster opted out); None where the provider's own firewall guards the nodes.
    firewall: bool | None = None
    nodes: list[NodeOutput]

    _ssh_user = field_validator("ssh_user")(lambda value: value and check_login(value))

    @field_validator("name")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        # It names .fatpipe/<cluster>, runs/<cluster> and the node folder's marker.
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(f"{value!r} is not a cluster name (lowercase letters, digits and '-')")
        return value

    @field_validator("nccl")
    @classmethod
    def _nccl_names(cls, nccl: dict[str, str]) -> dict[str, str]:
        for key, value in nccl.items():
            if not NCCL_NAME.fullmatch(key):
                raise ValueError(f"{key!r} is not an NCCL_* or GLOO_* variable name (capitals, digits, '_')")
            if CONTROL.search(value):
                raise ValueError(f"{key}: the value {value!r} holds a control character")
        return nccl

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        if value not in PROVIDERS:
            raise ValueError(f"{value!r} is not a provider; allowed: {', '.join(PROVIDERS)}")
        return value

    @field_validator("nodes")
    @classmethod
    def _nodes_distinct(cls, nodes: list[NodeOutput]) -> list[NodeOutput]:
        if not nodes:
            raise ValueError("the cluster has no nodes")
        for attr in ("name", "private_ip"):
            seen: set[str] = set()
            for node in nodes:
                value = getattr(node, attr)
                if value in seen:
                    raise ValueError(f"two nodes share {attr} {value}")
                seen.add(value)
        # A loopback private_ip is a node on this machine (sim): beside one elsewhere, each node
        # would dial itself where it meant that peer.
        looped = [ipaddress.IPv4Address(node.private_ip).is_loopback for node in nodes]
        if any(looped) and not all(looped):
            inside, outside = nodes[looped.index(True)], nodes[looped.index(False)]
            raise ValueError(f"node {inside.name}'s private_ip {inside.private_ip} is a loopback address "
                             f"but node {outside.name}'s {outside.private_ip} is not: no peer can reach it")
        return nodes

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.nodes[0].private_ip}:{self.rdzv_port}"


def unwrap_outputs(doc: dict, cluster: str | None = None) -> dict:
    """The bare `cluster` object from any of the three shapes (docs/ARCHITECTURE.md)."""
    if not isinstance(doc, dict):
        raise FatpipeError("outputs: expected a JSON object")
    if "cluster" in doc:  # terraform/tofu output -json, or cdktf's `--outputs-file` per stack
        inner = doc["cluster"]
        return inner["value"] if isinstance(inner, dict) and "value" in inner and "type" in inner else inner
    if "nodes" in doc and "provider" in doc:  # the bare object
        return doc
    stacks = {k: v for k, v in doc.items() if isinstance(v, dict) and "cluster" in v}
    if stacks:  # cdktf deploy --outputs-file: {"<stack>": {"cluster": {...}}}
        if cluster is None and len(stacks) > 1:
            raise FatpipeError(f"outputs hold several stacks ({', '.join(stacks)}): name the cluster")
        key = cluster if cluster is not None else next(iter(stacks))
        if key not in stacks:
            raise FatpipeError(f"outputs have no stack {key!r}; found {', '.join(stacks)}")
        return unwrap_outputs(stacks[key])
    raise FatpipeError("outputs: no `cluster` output found (expected cdktf, terraform or bare shape)")


def parse_outputs(doc: dict, cluster: str | None = None, label: str = "outputs") -> ClusterOutputs:
    bare = unwrap_outputs(doc, cluster)
    try:
        return ClusterOutputs.model_validate(bare)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        key = ".".join(str(p) for p in err["loc"]) or "cluster"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required but missing"
        raise FatpipeError(f"{label}: {key}: {msg}") from None


def read_outputs(path: Path, cluster: str | None = None) -> ClusterOutputs:
    """Read and validate an outputs file of any supported shape."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise FatpipeError(f"{path}: no outputs file; deploy the cluster first (fatpipe deploy)") from None
    except json.JSONDecodeError as e:
        raise FatpipeError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    return parse_outputs(doc, cluster, label=str(path))
