"""DigitalOcean: droplets in one VPC, a tag-based firewall; the VPC network runs at MTU 1500."""

from __future__ import annotations

from .base import Provider


class DigitalOcean(Provider):
    name = "digitalocean"
    mtu = 1500  # DigitalOcean's VPC network does not carry jumbo frames
    user_data_limit = 64 * 1024

    def construct(self, scope, cluster, project):
        from .digitalocean_stack import DigitalOceanClusterConstruct

        return DigitalOceanClusterConstruct(scope, "cluster_resources", cluster=cluster,
                                            size=self.machine(cluster, project.root),
                                            user_data=self.user_data(cluster), project_id=project.project_id)

    def preflight(self, cluster, project, log=None):
        from .digitalocean_api import preflight  # a test may stand in for this module

        return preflight(cluster, project, size=self.machine(cluster, project.root).name, log=log)

    def refresh_catalog(self, region, root, types=(), families=()):
        from .digitalocean_sizes import refresh_digitalocean_catalog

        return refresh_digitalocean_catalog(region, root, types=types, families=families)


DIGITALOCEAN = DigitalOcean()
