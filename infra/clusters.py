"""The cluster file, fatpipe.toml: one model per provider, and the whole file (ProjectSpec)."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .awsspec import AwsCluster
from .dataspec import DataSpec
from .firewall import in_private_range, public_address_problem
from .hostvalues import check_address, check_login, check_node_name, check_path, one_host
from .node import remote_dir_problem
from .nodespec import NodeSpec
from .runspec import RunSpec
from .simspec import SimCluster
from .spec import (
    DIGITALOCEAN_REGIONS,
    NAME_PATTERN,
    RESERVED_NAMES,
    CloudCluster,
    ClusterBase,
)
from .trainspec import Strict, TrainSpec
from .vmspec import VmCluster


class DigitalOceanCluster(CloudCluster):
    provider: Literal["digitalocean"]
    machine_field: ClassVar[str] = "size"
    prefix_range: ClassVar[tuple[int, int]] = (16, 24)  # what DigitalOcean accepts for a VPC
    size: str | None = None
    image: str = "ubuntu-24-04-x64"
    ssh_user: str = "root"
    # DigitalOcean refuses to add a public key the account already holds: name that key instead.
    ssh_key_fingerprint: str | None = None

    @field_validator("ssh_key_fingerprint")
    @classmethod
    def _md5_fingerprint(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"([0-9a-f]{2}:){15}[0-9a-f]{2}", value):
            raise ValueError(f"{value!r} is not an MD5 key fingerprint such as 3b:16:...:9f "
                             "(see `doctl compute ssh-key list`)")
        return value

    @field_validator("region")
    @classmethod
    def _known_region(cls, value: str) -> str:
        if value not in DIGITALOCEAN_REGIONS:
            raise ValueError(f"{value!r} is not a DigitalOcean region; allowed: {', '.join(DIGITALOCEAN_REGIONS)}")
        return value


class SshHost(Strict):
    """One machine of an `ssh` cluster: how to reach it, and its address on the fast network."""

    address: str = Field(min_length=1)  # a host name or IP that SSH reaches (~/.ssh/config applies)
    private_ip: str
    port: int = Field(22, ge=1, le=65535)
    user: str | None = None  # default: the cluster's ssh_user
    name: str | None = None  # default: <cluster>-<index>
    remote_dir: str | None = None  # the project folder there (default: ~/fatpipe/<cluster>)

    @field_validator("remote_dir")
    @classmethod
    def _folder_of_its_own(cls, value: str | None) -> str | None:
        # `down` removes this folder: never the home, / or a system folder (infra.node's rule).
        problem = None if value is None else remote_dir_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("private_ip")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        try:
            ip = ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv4 address (the host's address on the private network)") from None
        return one_host(ip)  # public_private_ips lets in any range, never an address of many hosts

    # Host values reach ssh, rsync and the provisioners: checked here (infra/hostvalues.py).
    _address = field_validator("address")(check_address)
    _login = field_validator("user")(lambda value: value if value is None else check_login(value))
    _node_name = field_validator("name")(lambda value: value if value is None else check_node_name(value))


class SshCluster(ClusterBase):
    """Machines that already exist (rented anywhere), reached over SSH; fatpipe tunes and untunes them."""

    provider: Literal["ssh"]
    host_keys: ClassVar[str] = "user"  # the user's own known_hosts and ssh config
    hosts: list[SshHost] = Field(min_length=1)
    ssh_user: str = "root"
    ssh_key_file: str | None = None  # a private key; default: what ssh itself would use
    install_packages: bool = True  # apt-get the node tools (iperf3, rsync, ...) where apt exists
    mtu: int | None = Field(None, ge=576, le=9216)  # the private NIC's MTU; default: left as it is
    # The private network, where the user declares one: then the firewall trusts all of it but the
    # run's ports (the nodes' alone). Left out, it trusts each node's own address (infra/firewall.py).
    private_cidr: str | None = None
    # The host firewall: the nodes reach every port, the world only SSH
    # (docs/ARCHITECTURE.md, "The node firewall"); false opts out, with a warning at every launch.
    firewall: bool = True
    public_private_ips: bool = False  # private_ip outside RFC 1918 and 100.64.0.0/10 is meant

    @field_validator("private_cidr")
    @classmethod
    def _private_ipv4_network(cls, value: str | None) -> str | None:
        # Replaces ClusterBase's: which ranges are private is _addresses_private's, which knows
        # public_private_ips.
        return None if value is None else str(ipaddress.IPv4Network(value, strict=True))

    _login = field_validator("ssh_user")(check_login)
    _key_file = field_validator("ssh_key_file")(lambda value: value if value is None else check_path(value))

    @model_validator(mode="before")
    @classmethod
    def _nodes_from_hosts(cls, data):
        if isinstance(data, dict) and isinstance(data.get("hosts"), list):
            if "nodes" in data and data["nodes"] != len(data["hosts"]):
                raise ValueError(f"nodes is {data['nodes']} but {len(data['hosts'])} hosts are listed; leave nodes out")
            data = {**data, "nodes": len(data["hosts"])}
        return data

    @model_validator(mode="after")
    def _cidr_holds_nodes(self):
        # Overrides ClusterBase's: hosts name their own private IPs (no .10+i numbering).
        return self

    @model_validator(mode="after")
    def _hosts_distinct_and_inside(self):
        net = ipaddress.IPv4Network(self.private_cidr or "0.0.0.0/0")
        seen: dict[str, int] = {}
        for i, host in enumerate(self.hosts):
            for key in (f"{host.address}:{host.port}", host.private_ip, host.name or ""):
                if key and key in seen:
                    raise ValueError(f"hosts[{i}] repeats {key} of hosts[{seen[key]}]")
                seen[key] = i
            if ipaddress.IPv4Address(host.private_ip) not in net:
                raise ValueError(f"hosts[{i}].private_ip {host.private_ip} is outside private_cidr {net}")
        return self

    @model_validator(mode="after")
    def _addresses_private(self):
        if self.public_private_ips:
            return self
        for i, host in enumerate(self.hosts):
            if not in_private_range(host.private_ip):
                raise ValueError(public_address_problem(f"hosts[{i}].private_ip", host.private_ip))
        if self.private_cidr and not in_private_range(self.private_cidr):
            raise ValueError(public_address_problem("private_cidr", self.private_cidr))
        if not in_private_range(self.node_network):  # each node finds its private NIC in it
            raise ValueError(public_address_problem("the network holding every private_ip,", self.node_network))
        return self

    @property
    def region(self) -> str:
        return "ssh"

    @property
    def node_network(self) -> str:
        """`private_cidr`, else the smallest network holding every node: where a node's private
        NIC is found. Never what the firewall trusts (infra/firewall.py)."""
        return self.private_cidr or covering_network([h.private_ip for h in self.hosts]) or "0.0.0.0/0"

    def node_name(self, index: int) -> str:
        return self.hosts[index].name or f"{self.name}-{index}"

    def private_ip(self, index: int) -> str:
        return self.hosts[index].private_ip


def covering_network(ips: list) -> str | None:
    """The smallest IPv4 network holding every address (at most a /30 around a single one);
    None while an address is bad (the host's own validator names it)."""
    try:
        addresses = [ipaddress.IPv4Address(ip) for ip in ips]
    except ValueError:
        return None
    prefix = 30
    while prefix > 0:
        net = ipaddress.IPv4Network(f"{addresses[0]}/{prefix}", strict=False)
        if all(a in net for a in addresses):
            return str(net)
        prefix -= 1
    return "0.0.0.0/0"


# The cluster file's models, one per provider, by the `provider` key that selects them.
CLUSTER_MODELS: dict[str, type[ClusterBase]] = {
    "sim": SimCluster, "aws": AwsCluster, "digitalocean": DigitalOceanCluster, "ssh": SshCluster,
    "vm": VmCluster,
}
PROVIDERS = tuple(CLUSTER_MODELS)


def model_of(provider) -> type[ClusterBase] | None:
    """The cluster model of `provider`: a cluster file's or an outputs' value, checked or not."""
    return CLUSTER_MODELS.get(provider) if isinstance(provider, str) else None


def shares_kernel(provider) -> bool:
    """Whether the nodes of a `provider` cluster share this machine's kernel."""
    model = model_of(provider)
    return model is not None and model.shares_kernel
Cluster = Annotated[SimCluster | AwsCluster | DigitalOceanCluster | SshCluster | VmCluster,
                    Field(discriminator="provider")]


class ProjectSpec(Strict):
    clusters: dict[str, Cluster] = Field(min_length=1)
    train: TrainSpec = Field(default_factory=TrainSpec)
    node: NodeSpec = Field(default_factory=NodeSpec)  # every node's Python environment
    data: DataSpec | None = None  # every cluster's dataset, unless a cluster declares its own
    run: RunSpec = Field(default_factory=RunSpec)  # what every run brings back from node 0

    @field_validator("clusters", mode="before")
    @classmethod
    def _names_from_keys(cls, value):
        if isinstance(value, dict):
            for key, table in value.items():
                if key in RESERVED_NAMES:
                    raise ValueError(f"cluster name {key!r} is reserved (.fatpipe/{key}/ is not a cluster's folder)")
                if not NAME_PATTERN.match(key):
                    raise ValueError(
                        f"cluster name {key!r} must be lowercase letters, digits and '-', "
                        "starting with a letter, at most 24 characters"
                    )
                if isinstance(table, dict):
                    if "name" in table and table["name"] != key:
                        raise ValueError(f"clusters.{key}.name must equal its table key or be left out")
                    table["name"] = key
        return value

    @model_validator(mode="after")
    def _sim_addresses_distinct(self):
        # Two sim clusters on one machine must not share addresses: not their networks, nor the
        # loopback ranges derived from them (127.<low 24 bits of the network>).
        sims = [c for c in self.clusters.values() if c.shares_kernel]
        for i, a in enumerate(sims):
            net_a = ipaddress.IPv4Network(a.private_cidr)
            for b in sims[i + 1:]:
                net_b = ipaddress.IPv4Network(b.private_cidr)
                low_a, low_b = (int(n.network_address) & 0xFFFFFF for n in (net_a, net_b))
                if net_a.overlaps(net_b) or low_a == low_b:
                    raise ValueError(
                        f"sim clusters {a.name} and {b.name} would share addresses ({a.private_cidr}, "
                        f"{b.private_cidr}); give one another private_cidr, e.g. 10.43.0.0/24"
                    )
        return self
