"""DigitalOcean: droplets in one VPC, a tag-based firewall; the VPC network runs at MTU 1500."""

from __future__ import annotations

import os
import re

import fatpipe.stacks.providers.digitalocean_api as digitalocean_api  # a test may stand in for its preflight
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.lazy import load

from .base import Provider
from .digitalocean_api import TOKEN_ENVS
from .digitalocean_sizes import refresh_digitalocean_catalog

# The Python of DigitalOcean's Ubuntu images, by the release in the image's slug.
UBUNTU_PYTHON = {"20-04": "3.8", "22-04": "3.10", "24-04": "3.12", "24-10": "3.12", "25-04": "3.13"}
UBUNTU_IMAGE = re.compile(r"^ubuntu-(\d\d-\d\d)-")


class DigitalOcean(Provider):
    name = "digitalocean"
    mtu = 1500  # DigitalOcean's VPC network does not carry jumbo frames
    user_data_limit = 64 * 1024

    def construct(self, scope, cluster, project):
        stack = load("fatpipe.stacks.providers.digitalocean_stack")  # the CDK: a synth's alone
        return stack.DigitalOceanClusterConstruct(scope, "cluster_resources", cluster=cluster,
                                                  size=self.machine(cluster, project.root),
                                                  user_data=self.user_data(cluster), project_id=project.project_id)

    def image_python(self, cluster) -> str | None:
        found = UBUNTU_IMAGE.match(cluster.image or "")
        return UBUNTU_PYTHON.get(found.group(1)) if found else None

    def preflight(self, cluster, project, log=None):
        return digitalocean_api.preflight(cluster, project, size=self.machine(cluster, project.root).name, log=log)

    def refresh_wanted(self, region: str | None, filtered: bool) -> bool:
        """Whenever its token is in the environment."""
        token = any(os.environ.get(name) for name in TOKEN_ENVS)
        if filtered and not token:
            raise ConfigError("--types/--families refresh from the sizes API: set DIGITALOCEAN_TOKEN")
        return token

    def refresh_catalog(self, region, root, types=(), families=()):
        return refresh_digitalocean_catalog(region, root, types=types, families=families)


DIGITALOCEAN = DigitalOcean()
