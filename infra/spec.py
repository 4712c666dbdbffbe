"""The cluster file's building blocks: what every cluster has (ClusterBase), what clouds share, a backend."""

from __future__ import annotations

import ipaddress
import re
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .dataspec import DataSpec
from .hostvalues import check_login
from .lazy import load
from .netlimits import NO_PUBLISHED_CAPS, NetworkLimits
from .nodespec import NodeSpec
from .trainspec import Strict

Tier = Literal["1g", "10g", "25g"]
TIER_GBPS: dict[str, int] = {"1g": 1, "10g": 10, "25g": 25}
# The round trip the nodes' TCP buffers are sized for unless a cluster declares its own
# (`max_rtt_ms`): far above in-region RTTs (0.05-2 ms); nodes across regions declare theirs.
DEFAULT_MAX_RTT_MS = 10.0

# Nodes get deterministic private IPs from this host offset up, so the rendezvous endpoint
# (node 0) is known before anything boots. AWS reserves the first four addresses of a subnet
# and the last one; starting at .10 leaves room for that on every provider.
FIRST_HOST_OFFSET = 10
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
RESERVED_NAMES = ("catalog", "project-id")  # names of other things under .fatpipe/

DIGITALOCEAN_REGIONS = (
    "ams3", "atl1", "blr1", "fra1", "lon1", "nyc1", "nyc2", "nyc3",
    "sfo2", "sfo3", "sgp1", "syd1", "tor1",
)  # fmt: skip


def group_of(index: int, groups: int, nodes: int) -> int:
    """Which of `groups` consecutive, near-equal groups node `index` of `nodes` falls in: how a
    cluster in several regions splits its nodes (vm regions, AWS regions)."""
    return index * groups // nodes


@lru_cache(maxsize=1)
def aws_regions() -> frozenset[str]:
    """Regions botocore's bundled endpoint data knows for EC2 (offline; includes opt-in ones)."""
    session = load("botocore.session").get_session()
    regions: set[str] = set()
    for partition in session.get_available_partitions():
        regions.update(session.get_available_regions("ec2", partition_name=partition))
    return frozenset(regions)


class Backend(Strict):
    """Where terraform keeps state: a local file under .fatpipe/<cluster>/ or an S3 bucket."""

    type: Literal["local", "s3"] = "local"
    bucket: str | None = None
    key: str | None = None
    region: str | None = None
    use_lockfile: bool = True

    @model_validator(mode="after")
    def _s3_needs_bucket(self) -> Backend:
        if self.type == "s3" and not self.bucket:
            raise ValueError("an s3 backend needs bucket = \"...\"")
        return self

    @property
    def minimum_terraform(self) -> str:
        """terraform_data needs 1.4; S3-native state locking (use_lockfile) needs 1.10."""
        return "1.10" if self.type == "s3" and self.use_lockfile else "1.4"


class ClusterBase(Strict):
    name: str = ""  # filled from the table key
    machine_field: ClassVar[str | None] = None  # the key naming a machine type, where one can be named
    # The network sizes the provider accepts for its private network (prefix lengths).
    prefix_range: ClassVar[tuple[int, int]] = (8, 30)
    # What differs by provider and the cluster file's layers own (docs/ARCHITECTURE.md, "Adding a
    # provider"): the provider's published network limits (`fatpipe plan`), whether its nodes share
    # this machine's kernel (their addresses must differ from every other such cluster's, and
    # NCCL's shared memory would bypass their shaped links), and whether an S3 state bucket
    # defaults to the cluster's own region; and how its nodes' SSH host keys are checked
    # (ops/reach/hostkeys.py: pinned from the console, the user's own, or accept-new).
    network: ClassVar[NetworkLimits] = NO_PUBLISHED_CAPS
    host_keys: ClassVar[str] = "accept-new"
    shares_kernel: ClassVar[bool] = False
    state_bucket_in_region: ClassVar[bool] = False
    nodes: int = Field(4, ge=1, le=512)
    tier: Tier = "1g"
    gpus_per_node: int = Field(0, ge=0, le=16)
    private_cidr: str = "10.42.0.0/24"
    rdzv_port: int = Field(29400, ge=1024, le=65535)
    # The longest round trip between two nodes: the TCP buffers hold its bandwidth-delay
    # product (infra/tiers.py). Default DEFAULT_MAX_RTT_MS; nodes across regions declare theirs.
    max_rtt_ms: float | None = Field(None, ge=0.1, le=1000)
    backend: Backend = Field(default_factory=Backend)
    data: DataSpec | None = None  # this cluster's dataset ([clusters.<name>.data]); else [data]
    node: NodeSpec | None = None  # keys that replace the project's [node] here ([clusters.<name>.node])

    @field_validator("node", mode="before")
    @classmethod
    def _node_is_a_table(cls, value, info: ValidationInfo):
        # `node = 4` is nearly always `nodes = 4` mistyped: say so rather than "not a dictionary".
        if value is not None and not isinstance(value, (dict, NodeSpec)):
            table = f"[clusters.{info.data.get('name') or '<name>'}.node]"
            raise ValueError(f"{value!r} is not a table ({table} is the node environment); did you mean nodes?")
        return value

    @field_validator("private_cidr")
    @classmethod
    def _private_ipv4_network(cls, value: str | None) -> str | None:
        if value is None:  # an ssh cluster derives it from its hosts
            return None
        try:
            net = ipaddress.IPv4Network(value, strict=True)
        except ValueError as e:
            raise ValueError(f"{value!r} is not an IPv4 network such as 10.42.0.0/24 ({e})") from None
        if not net.is_private:
            raise ValueError(f"{value} is not a private range (use 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16)")
        return str(net)

    @model_validator(mode="after")
    def _cidr_holds_nodes(self):
        shortest, longest = self.prefix_range
        prefix = ipaddress.IPv4Network(self.private_cidr).prefixlen
        if not shortest <= prefix <= longest:
            raise ValueError(f"private_cidr {self.private_cidr}: a {self.provider} network is /{shortest} to "
                             f"/{longest}, not /{prefix}")
        size = ipaddress.IPv4Network(self.private_cidr).num_addresses
        usable = size - FIRST_HOST_OFFSET - 1
        if self.nodes > usable:
            raise ValueError(
                f"private_cidr {self.private_cidr} holds at most {max(usable, 0)} nodes "
                f"(addresses start at .{FIRST_HOST_OFFSET}); use a larger network such as /22"
            )
        return self

    @property
    def tier_gbps(self) -> int:
        return TIER_GBPS[self.tier]

    @property
    def rtt_budget_ms(self) -> float:
        """The round trip the tier profile's buffers are sized for."""
        return self.max_rtt_ms or DEFAULT_MAX_RTT_MS

    def private_ip(self, index: int) -> str:
        """The deterministic private IP of node `index`."""
        net = ipaddress.IPv4Network(self.private_cidr)
        return str(net.network_address + FIRST_HOST_OFFSET + index)

    def node_name(self, index: int) -> str:
        return f"{self.name}-{index}"

    @property
    def node_regions(self) -> list[str]:
        """The regions the nodes are in: the cluster's one region, unless its model spans several."""
        return [self.region]

    @property
    def node_network(self) -> str:
        """The network holding every node's private address (an `ssh` cluster may declare none)."""
        return self.private_cidr

    @model_validator(mode="after")
    def _s3_region_given(self):
        # An AWS cluster's state bucket defaults to the cluster's region; nothing else has one.
        if self.backend.type == "s3" and self.backend.region is None and not self.state_bucket_in_region:
            raise ValueError(f"backend.region: required for the S3 state bucket of a {self.provider} "
                             "cluster (for example \"us-east-1\")")
        return self

    def deployment_keys(self, outputs) -> list[tuple[str, object, object]]:
        """(key, in the outputs, in the cluster file) for what else deployed `outputs` must match to
        be this cluster, beyond what every provider's must (ops/reach/deployment.py)."""
        return []

    def output(self, nodes: list[dict], **extra) -> dict:
        """The stack's `cluster` output (docs/ARCHITECTURE.md, "The outputs contract") for these nodes."""
        return {
            "name": self.name, "provider": self.provider, "region": self.region,
            "tier_gbps": self.tier_gbps, "private_cidr": self.node_network,
            "ssh_user": self.ssh_user, "gpus_per_node": self.gpus_per_node,
            "rdzv_port": self.rdzv_port, "max_rtt_ms": self.rtt_budget_ms, **extra, "nodes": nodes,
        }


class LocalCluster(ClusterBase):
    """Nodes on this machine (sim namespaces, local VMs) whose links fatpipe shapes with tc."""

    # Shape the links to this rate instead of the tier's (a time-scaled rehearsal: the link a
    # GPU node would see, slowed as much as this machine's compute is); the tier stays declared.
    link_gbps: float | None = Field(None, ge=0.001, le=100)

    @property
    def link_rate_gbps(self) -> float:
        """The rate the links are shaped to."""
        return self.link_gbps if self.link_gbps is not None else float(self.tier_gbps)

    @property
    def region(self) -> str:
        return "local"


class CloudCluster(ClusterBase):
    """What AWS and DigitalOcean clusters share: a region, an SSH key and who may SSH in."""

    region: str
    ssh_public_key: str = "~/.ssh/id_ed25519.pub"
    ssh_cidr: str
    allow_ssh_from_anywhere: bool = False
    ssh_user: str = "ubuntu"
    _login = field_validator("ssh_user")(check_login)  # it reaches ssh (infra/hostvalues.py)

    @field_validator("ssh_public_key")
    @classmethod
    def _key_file_exists(cls, value: str) -> str:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"public key file {value} does not exist (make one with ssh-keygen -t ed25519)")
        text = path.read_text(errors="replace").strip()
        if not text.startswith(("ssh-", "ecdsa-", "sk-")):
            raise ValueError(f"{value} is not an OpenSSH public key (expected a line starting ssh-ed25519 or ssh-rsa)")
        return value

    @field_validator("ssh_cidr")
    @classmethod
    def _network(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_network(value, strict=True))
        except ValueError as e:
            raise ValueError(f"{value!r} is not a network such as 203.0.113.7/32 ({e})") from None

    @model_validator(mode="after")
    def _ssh_not_open_to_world(self):
        if ipaddress.ip_network(self.ssh_cidr).prefixlen == 0 and not self.allow_ssh_from_anywhere:
            raise ValueError(
                f"ssh_cidr {self.ssh_cidr} opens SSH to the whole internet; "
                "give your own address/32, or set allow_ssh_from_anywhere = true"
            )
        return self

    @property
    def public_key(self) -> str:
        return Path(self.ssh_public_key).expanduser().read_text().strip()
