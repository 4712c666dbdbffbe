"""The provider interface: what every provider (a cloud, or the sim) must supply, declared once.

A provider is an object of a `Provider` subclass in its own module, listed in the registry
(`fatpipe.stacks.providers.PROVIDERS`). Methods that need a cloud SDK or CDK bindings import
them in their body, so the registry stays cheap to import. Adding a provider:
docs/ARCHITECTURE.md, "Adding a provider".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from fatpipe.infra.catalog import Estimate, MachineType, estimate, machine_for
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.tiers import tier_profile
from fatpipe.stacks.node_profile import render_cloud_init

if TYPE_CHECKING:
    from .construct import ClusterConstruct


class Provider(ABC):
    """One provider: its stack construct, node profile facts, catalog, preflight and costs."""

    name: ClassVar[str]  # the cluster file's `provider` value
    mtu: ClassVar[int]  # the private network's MTU, set on every node's private NIC
    user_data_limit: ClassVar[int]  # bytes of user data (cloud-init) a node accepts
    paid: ClassVar[bool] = True  # deploy asks before creating its resources (unless --yes)

    @abstractmethod
    def construct(self, scope, cluster, project) -> ClusterConstruct:
        """Add the cluster's resources to `scope` (a TerraformStack) as one construct."""

    def nccl_env(self, cluster) -> dict[str, str]:
        """NCCL's settings on this provider's nodes: the tier's socket threads by default."""
        return dict(tier_profile(cluster.tier).nccl)

    def user_data(self, cluster) -> str:
        """The node profile as cloud-init user data, for this provider's MTU and size limit. The
        cluster's boot tuning alone: nothing of the project (its version, requirements, torch), so
        that changing the project never makes a new node (docs/ARCHITECTURE.md, "The deploy plan")."""
        return render_cloud_init(cluster, self.mtu, self.user_data_limit, self.nccl_env(cluster))

    def console_output(self, outputs, node) -> str | None:
        """The node's console through the provider's authenticated API, where it has one:
        cloud-init prints the node's SSH host keys there (ops/reach/hostkeys.py pins them)."""
        return None

    def warnings(self, cluster) -> list[str]:
        """What the user should know before deploying this cluster (shown by synth)."""
        return []

    def machine(self, cluster, root: Path | None = None) -> MachineType:
        """The machine type the cluster's nodes get (named, else the cheapest for the tier)."""
        return machine_for(cluster, root)

    def estimate(self, cluster, root: Path | None = None) -> Estimate:
        """The machine and the estimated $/hour of all the cluster's nodes."""
        return estimate(cluster, root)

    def preflight(self, cluster, project, log=None):
        """Ask the provider's API whether `cluster` can be deployed as declared.

        Raises FatpipeError (one line) if not; returns the cluster to deploy, with what the
        API settled filled in (for instance an SSH key already on the account); `log` takes
        warnings. By default there is nothing to ask.
        """
        return cluster

    def refresh_catalog(self, region: str | None, root: Path, types: tuple[str, ...] = (),
                        families: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
        """Refresh the machine catalog of `region` (None: every region, where the API allows)
        from the provider's API, limited to `types`/`families` when given; return its file and
        one line per change against the catalog in use before."""
        raise FatpipeError(f"{self.name} has no machine API to refresh from; its catalog ships with fatpipe")

    def refresh_wanted(self, region: str | None, filtered: bool) -> bool:
        """Whether `fatpipe catalog` refreshes the catalog from the API before showing it
        (`filtered`: only some types or families asked for). Raises ConfigError where the
        filter cannot be served."""
        return False

    def sweep(self, project, cluster_name: str, log) -> list[str]:
        """After a destroy: remove what the destroy could not reach; return what was removed."""
        return []

    def left_alone(self, cluster_name: str) -> list[str]:
        """After a destroy and its sweep: what is still named like the cluster's nodes because it
        is another project's (a same-named cluster deployed from another folder)."""
        return []

    def vanished_nodes(self, project, outputs) -> list[str]:
        """Nodes of the deployed `outputs` that terraform's state still holds but that are gone
        (a reboot ends local nodes): a plain apply would see nothing to do, so they are made again."""
        return []

    def image_python(self, cluster) -> str | None:
        """The Python of the image the cluster's nodes boot, where it is known before they exist
        (the wheel preflight asks the index for it before anything is paid for)."""
        return None
