"""Providers behind one interface (`base.Provider`), found by the cluster file's `provider` key.

Each provider is one module (its `Provider` subclass) plus, where it has one, a `*_stack`
module with its cluster construct and a module for its API; the registry below is the one list.
"""

from __future__ import annotations

from fatpipe.infra.errors import ConfigError

from .aws import AWS
from .base import Provider
from .digitalocean import DIGITALOCEAN
from .sim import SIM
from .ssh import SSH
from .vm import VM

PROVIDERS: dict[str, Provider] = {p.name: p for p in (SIM, AWS, DIGITALOCEAN, SSH, VM)}


def provider_for(name: str) -> Provider:
    """The provider registered as `name` (a cluster's `provider`)."""
    try:
        return PROVIDERS[name]
    except KeyError:
        raise ConfigError(f"unknown provider {name!r}; allowed: {', '.join(PROVIDERS)}") from None


def provider_of(cluster) -> Provider:
    """The provider of `cluster`, a declared cluster or None: a cluster no longer declared can only
    be a sim one left from an edited file (a cloud's destroy needs its spec)."""
    return SIM if cluster is None else provider_for(cluster.provider)
