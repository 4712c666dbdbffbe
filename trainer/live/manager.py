"""torchft's Manager for one replica group (a node), every server it starts on the private address.

torchft advertises `socket.gethostname()` and binds every interface: its manager server on
`[::]`, its checkpoint server (which hands the live weights to a returning replica) on `""`.
Sim nodes share one hostname and DigitalOcean maps it to 127.0.1.1, and the training ports must
be reachable from the nodes only (docs/security.md). So both are bound to, and advertised as,
the node's private address (never one of every interface: `quorum.one_host_ip`), on an
ephemeral port the node firewall keeps for the nodes; and a returning replica loads the weights
it is sent with `weights_only=True`, never unpickling what a peer serves.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

from fatpipe.node import env as node_env

from ..config import ConfigError
from ..lazy import load
from .epochs import EpochClient
from .quorum import one_host_ip
from .timeouts import HealTimeouts

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

# How long a collective across replica groups may take before the group counts the step as
# failed and a new quorum forms without the peer that did not answer. A killed peer's sockets
# close at once; a cut link is only seen by this timeout. Steps on the sim take about a second.
# The floor: in a quorum where a group is sent the live state, longer (live.timeouts).
COLLECTIVE_TIMEOUT_S = 6.0
# How long one quorum request waits before it is sent again (live.step.LiveStep._quorum): a
# request in flight when the Lighthouse died is lost with it; asked again, it reaches the one
# the node supervisor started in its place while the others' requests wait for it (join timeout).
QUORUM_TIMEOUT_S = 5.0
# How often the node's Manager server asks the Lighthouse again, within one request's timeout,
# after the Lighthouse's answer failed (torchft's `quorum_retries`, spaced timeout / (retries + 1),
# 100 ms at least). With none, a Lighthouse that dies mid-quorum (its node killed: the relay's
# connection to it reset at once) leaves the request waiting out QUORUM_TIMEOUT_S: torchft's
# server answers nobody when its quorum failed. Asked again, the request goes through the relay,
# which has moved to the next Lighthouse within about a second (live.relay).
QUORUM_RETRIES = 15


@dataclass(frozen=True)
class LiveSettings:
    """Where a replica group finds the Lighthouse and its own servers' address."""

    lighthouse: str  # host:port
    private_ip: str  # every server binds and advertises this
    replica_id: str  # the node's name: the summary's joins and leaves name it
    store_port: int  # the node's torchrun store, where peers form the cross-node gloo group
    node_rank: int = 0  # this node's index in the cluster file
    nodes: int = 1  # the cluster's node count
    min_replicas: int = 1  # replica groups a step needs to commit: the Lighthouses' majority
    manager_port: int = 0
    timeout_s: float = COLLECTIVE_TIMEOUT_S
    quorum_timeout_s: float = QUORUM_TIMEOUT_S
    tier_gbps: float | None = None  # the declared link rate (none: measured or the lowest tier)

    @property
    def lighthouse_url(self) -> str:
        return f"http://{self.lighthouse}"


def settings_from_env(env: Mapping[str, str] | None = None) -> LiveSettings:
    """The settings the launch path puts in every node's environment; ConfigError names a bad one."""
    env = os.environ if env is None else env
    lighthouse = env.get(node_env.LIVE_LIGHTHOUSE, "")
    host, _, port = lighthouse.rpartition(":")
    problem = _ip_problem(host.strip("[]"))
    if problem or not _is_port(port):
        raise ConfigError(f"{node_env.LIVE_LIGHTHOUSE} must be IP:PORT of the run's Lighthouse, "
                          f"got {lighthouse!r}" + (f": {problem}" if host and problem else ""))
    private_ip = env.get(node_env.PRIVATE_IP, "")
    problem = _ip_problem(private_ip)
    if problem:
        raise ConfigError(f"{node_env.PRIVATE_IP} must be this node's private IP address, "
                          f"got {private_ip!r}: {problem}")
    name = env.get(node_env.NODE_NAME) or socket.gethostname()
    if not _NODE_NAME.match(name):
        raise ConfigError(f"{node_env.NODE_NAME} {name!r}: letters, digits, '.', '_' and '-' only")
    store_port = env.get("MASTER_PORT", "")
    manager_port = env.get(node_env.LIVE_PORT, "0")
    if not _is_port(store_port) or not (manager_port == "0" or _is_port(manager_port)):
        raise ConfigError(f"MASTER_PORT ({store_port!r}) and {node_env.LIVE_PORT} "
                          f"({manager_port!r}) must be ports")
    node_rank, nodes = env.get(node_env.NODE_RANK, "0"), env.get(node_env.NODES, "1")
    if not (node_rank.isdigit() and nodes.isdigit() and int(node_rank) < int(nodes)):
        raise ConfigError(f"{node_env.NODE_RANK} ({node_rank!r}) must be a node index below "
                          f"{node_env.NODES} ({nodes!r})")
    min_replicas = env.get(node_env.LIVE_MIN_REPLICAS, "1")
    if not (min_replicas.isdigit() and 1 <= int(min_replicas) <= int(nodes)):
        raise ConfigError(f"{node_env.LIVE_MIN_REPLICAS} ({min_replicas!r}) must be 1 to "
                          f"{node_env.NODES} ({nodes})")
    tier = env.get(node_env.TIER_GBPS)
    if tier is not None and not _is_rate(tier):
        raise ConfigError(f"{node_env.TIER_GBPS} must be a link rate in Gbit/s above 0, got {tier!r}")
    return LiveSettings(lighthouse=lighthouse, private_ip=private_ip, replica_id=name,
                        store_port=int(store_port), node_rank=int(node_rank), nodes=int(nodes),
                        manager_port=int(manager_port), min_replicas=int(min_replicas),
                        tier_gbps=float(tier) if tier is not None else None)


def _is_rate(text: str) -> bool:
    try:
        return 0 < float(text) < float("inf")
    except ValueError:
        return False


def _ip_problem(text: str) -> str | None:
    """Why `text` is not one machine's IP address (none that binds every interface, nor a
    group's: quorum.one_host_ip); None when it is."""
    try:
        one_host_ip(text)
    except ValueError as e:
        return str(e)
    return None


def _is_port(text: str) -> bool:
    return text.isdigit() and 0 < int(text) < 65536


def host_in_url(ip: str) -> str:
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip


@contextlib.contextmanager
def _private_servers(ip: str, port: int) -> Iterator[None]:
    """While torchft builds its servers: the manager server and the checkpoint server bind
    `ip` (the manager server on `port`) instead of every interface."""
    tf_manager = load("torchft.manager")
    http_transport = load("torchft.checkpointing.http_transport")
    family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    plain_server = http_transport._IPv6HTTPServer

    class PrivateHTTPServer(plain_server):
        address_family = family

        def __init__(self, _address, handler):
            class PinnedTimeoutHandler(handler):
                def setup(self):
                    # The timeout the connection began with: live.timeouts changes the class's
                    # between quorums, and torchft asserts the socket's is still the handler's.
                    self.timeout = type(self).timeout
                    super().setup()

            super().__init__((ip, 0), PinnedTimeoutHandler)

    plain_manager = tf_manager.ManagerServer

    def private_manager(**kwargs):
        return plain_manager(**{**kwargs, "bind": f"{host_in_url(ip)}:{port}"})

    http_transport._IPv6HTTPServer, tf_manager.ManagerServer = PrivateHTTPServer, private_manager
    try:
        yield
    finally:
        http_transport._IPv6HTTPServer, tf_manager.ManagerServer = plain_server, plain_manager


def _private_transport(ip: str, timeout: timedelta):
    """torchft's HTTP checkpoint transport, advertising `ip` and loading with weights_only."""
    streaming_load = load("torchft.checkpointing._serialization")._streaming_load

    class PrivateHTTPTransport(load("torchft.checkpointing.http_transport").HTTPTransport):
        def address(self) -> str:
            return f"http://{host_in_url(ip)}:{self._server.socket.getsockname()[1]}/checkpoint/"

        @classmethod
        def _load_from_address(cls, address: str, timeout: timedelta) -> object:
            with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
                return streaming_load(f, weights_only=True)

    return PrivateHTTPTransport(timeout=timeout, num_chunks=0)


def _gloo_group(timeout: timedelta):
    """torchft's reconfigurable gloo group, each collective under the group's timeout of the
    moment (`live.timeouts` sets it at each quorum), not only the one it was configured with."""
    class PerCallTimeoutGloo(load("torchft.process_group").ProcessGroupGloo):
        configure_s = 0.0  # the last reconfigure's seconds (the quorum's split, `epochs.quorum_timings`)

        def _opts_hook(self, opts):
            if hasattr(opts, "timeout"):
                opts.timeout = self._timeout
            return opts

        def configure(self, *args, **kwargs):
            began = time.perf_counter()
            try:
                return super().configure(*args, **kwargs)
            finally:
                self.configure_s = time.perf_counter() - began

    return PerCallTimeoutGloo(timeout=timeout)


def live_manager(settings: LiveSettings, state_dict: Callable[[], dict],
                 load_state_dict: Callable[[dict], None], group_rank: int, group_size: int,
                 init_sync: bool = False):
    """The replica group's Manager and its cross-node gloo group (torchft's, reconfigured at
    every new quorum). `state_dict`/`load_state_dict`: what a returning replica is sent.
    `init_sync`: the first quorum sends every replica the state of one (a script's model that
    each node initialised on its own); the built-in trainer's start from one seed or checkpoint."""
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's servers log every step at info
    # ... and its Python side: each step's lines, and its quorum and commit records (empty
    # messages with `extra`, for its OpenTelemetry export) at info.
    for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
        logging.getLogger(name).setLevel(logging.WARNING)
    timeout = timedelta(seconds=settings.timeout_s)
    with _private_servers(settings.private_ip, settings.manager_port):
        transport = _private_transport(settings.private_ip, timeout)
        group = _gloo_group(timeout)
        manager = load("torchft").Manager(
            pg=group, min_replica_size=settings.min_replicas,
            state_dict=state_dict, load_state_dict=load_state_dict,
            timeout=timeout, quorum_timeout=timedelta(seconds=settings.quorum_timeout_s),
            connect_timeout=timedelta(seconds=30), rank=group_rank, world_size=group_size,
            quorum_retries=QUORUM_RETRIES,
            # Peers form the cross-node group on this node's torchrun store: its private address.
            store_addr=settings.private_ip, store_port=settings.store_port,
            lighthouse_addr=settings.lighthouse_url, replica_id=settings.replica_id,
            port=settings.manager_port, hostname=settings.private_ip,
            checkpoint_transport=transport, init_sync=init_sync)
    # Each quorum under an id of its own epoch, with the timeouts of a heal where one is in it.
    timeouts = HealTimeouts(manager, settings.timeout_s, settings.quorum_timeout_s,
                            settings.tier_gbps, group_size)
    manager._client = EpochClient(manager._client, settings.lighthouse, timeouts, init_sync, group)
    return manager
