"""Quorum epochs: the quorum id a replica group's Manager acts on, whichever Lighthouse formed the
quorum (docs/ARCHITECTURE.md, "Live fault tolerance").

torchft 0.2.0 configures a group's cross-node process group anew (and names the store prefix its
peers meet under) only when a quorum's id differs from the one it holds. Each Lighthouse numbers
its quorums from 1, and a quorum carries no Lighthouse identity: when node 0's Lighthouse dies,
node 1's may form the next quorum with an id the Managers already hold, and they would take the
step on the old group, the lost node in it. So the id acted on is a hash of the Lighthouse that
formed the quorum (the node's relay says which it forwards to: `relay.ASK`), that Lighthouse's
own id, the members, and the quorum's step when this combination first came: a Lighthouse
started again numbers from 1 again, and the step keeps its ids apart from the earlier ones.
Every member of a quorum was in its first round (a change of members is a new id at the
Lighthouse), so every member derives the same id. The group's timeouts are set here too, for
each quorum: a heal's where a group is sent the state, else the floors (`live.timeouts`).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import time

from .relay import ASK
from .timeouts import HealTimeouts, LinkRate, heal_copies

log = logging.getLogger(__name__)

ASK_PATH = ASK.split()[1].decode()
ASK_TIMEOUT_S = 2.0  # the relay runs on loopback


def epoch_id(lighthouse: str, quorum_id: int, replica_ids, since_step: int) -> int:
    """The quorum id a Manager acts on: 56 bits (never torchft's -1), the same for the same
    arguments."""
    text = json.dumps([lighthouse, quorum_id, sorted(replica_ids), since_step])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")


def serving_lighthouse(address: str, timeout_s: float = ASK_TIMEOUT_S) -> tuple[str, int] | None:
    """(the Lighthouse the relay at `address` forwards to, its switches so far); for a Lighthouse
    with no relay before it (tests), (address, 0); None when nothing answers or none serves."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        conn.request("GET", ASK_PATH)
        reply = conn.getresponse()
        body = reply.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if reply.status == 404:  # torchft's Lighthouse: it knows no such path
        return address, 0
    try:
        answer = json.loads(body)
        return (answer["lighthouse"], int(answer["switches"])) if answer["lighthouse"] else None
    except (ValueError, KeyError, TypeError):
        return None


class EpochClient:
    """torchft's ManagerClient, its quorums handed to the Manager under their epoch's id, the
    group's timeouts set for each (a heal's, or the floors). Everything else passes through."""

    def __init__(self, client, lighthouse: str, timeouts: HealTimeouts, init_sync: bool, group=None):
        self.client, self.lighthouse = client, lighthouse
        self.timeouts, self.init_sync = timeouts, init_sync
        self.group = group  # the cross-node gloo group: its reconfigure's seconds (`take_timings`)
        self.rpc_s = 0.0  # the last quorum's request: the Lighthouse's wait for its members
        self._key: tuple | None = None
        self._id = -1

    def _quorum(self, **kwargs):
        before = serving_lighthouse(self.lighthouse)
        asked = time.perf_counter()
        quorum = self.client._quorum(**kwargs)
        self.rpc_s = time.perf_counter() - asked
        after = serving_lighthouse(self.lighthouse)
        if before is None or before != after:  # which Lighthouse formed it is not known
            raise TimeoutError(f"the relay moved during the quorum ({before} -> {after})")
        quorum.quorum_id = self.epoch(after[0], quorum)
        copies = heal_copies(quorum, self.init_sync)
        seconds = self.timeouts.apply(copies)
        if copies:
            log.info("a group heals in this quorum: timeouts %.0f s (%.3g Gbit/s link)", seconds,
                     self.timeouts.link_gbps())
        return quorum

    def epoch(self, lighthouse: str, quorum) -> int:
        """The id of `quorum`'s epoch: a new one for a new Lighthouse, quorum id or member set."""
        key = (lighthouse, quorum.quorum_id, tuple(sorted(quorum.replica_ids)))
        if key != self._key:
            self._key, self._id = key, epoch_id(*key, quorum.max_step)
        return self._id

    def take_timings(self) -> dict:
        """The last quorum's parts, once: its request to the Lighthouse and the group's
        reconfigure (0 when the members did not change)."""
        configured = getattr(self.group, "configure_s", 0.0)
        if self.group is not None:
            self.group.configure_s = 0.0
        timings, self.rpc_s = {"quorum_rpc_s": self.rpc_s, "configure_s": configured}, 0.0
        return timings

    def __getattr__(self, name: str):
        if name == "client":  # not set yet
            raise AttributeError(name)
        return getattr(self.client, name)


def quorum_timings(manager) -> dict:
    """The parts of the Manager's last quorum (`EpochClient.take_timings`); {} for any other."""
    client = getattr(manager, "_client", None)
    return client.take_timings() if isinstance(client, EpochClient) else {}


def link_rate(manager) -> LinkRate | None:
    """The measured link rate of a Manager live.manager built (None for any other)."""
    client = getattr(manager, "_client", None)
    return client.timeouts.link if isinstance(client, EpochClient) else None
