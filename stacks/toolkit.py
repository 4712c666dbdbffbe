"""The one seam to the CDK toolkit: CDK for Terraform (`cdktf`) or its fork CDK Terrain (`cdktn`).

Every stack module takes the core's names (`from ..toolkit import App, Token, ...`) and the AWS
bindings (`aws_bindings()`) from here, so the same stack code synthesizes with either. Which one:
the environment variable FATPIPE_TOOLKIT (`cdktf`, the default, or `cdktn`). It is an environment
setting, not a key of fatpipe.toml, because it describes the installation and not the clusters:
both write the same Terraform JSON, and `cdktf synth`/`cdktn synth` start the app as a child that
inherits the environment. Nothing heavy is imported until a name is used: `fatpipe config` reports
the toolkit from package metadata alone. docs/toolkits.md.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from fatpipe.infra.errors import ConfigError, FatpipeError
from fatpipe.infra.lazy import load

ENV = "FATPIPE_TOOLKIT"
DEFAULT = "cdktf"
# The core names the stacks use (and `Construct`, from the constructs library both share): the
# whole surface both toolkits must offer, served by the module `__getattr__` below.
CORE_NAMES = (
    "App", "Fn", "LocalBackend", "LocalExecProvisioner", "S3Backend", "TerraformIterator",
    "TerraformLocal", "TerraformOutput", "TerraformProvider", "TerraformProviderGeneratorMetadata",
    "TerraformResource", "TerraformResourceLifecycle", "TerraformStack", "Testing", "Token",
)


@dataclass(frozen=True)
class Toolkit:
    """One toolkit: its Python modules, the distributions that carry them, how to install them."""

    name: str
    title: str
    core: str  # the core's module and distribution
    aws: str  # the prebuilt hashicorp/aws bindings' module
    aws_dist: str
    install: str

    def version(self) -> str | None:
        """The installed core's version, from package metadata (nothing is imported)."""
        try:
            return version(self.core)
        except PackageNotFoundError:
            return None


TOOLKITS = {
    "cdktf": Toolkit("cdktf", "CDK for Terraform", "cdktf", "cdktf_cdktf_provider_aws",
                     "cdktf-cdktf-provider-aws", "pip install fatpipe (cdktf is a dependency)"),
    "cdktn": Toolkit("cdktn", "CDK Terrain", "cdktn", "cdktn_provider_aws",
                     "cdktn-provider-aws", "pip install 'fatpipe[cdktn]'"),
}


def select(value: str | None) -> Toolkit:
    """The toolkit a FATPIPE_TOOLKIT value names (unset or empty: the default)."""
    name = (value or DEFAULT).strip().lower()
    if name not in TOOLKITS:
        raise ConfigError(f"{ENV}={value!r} is no toolkit; allowed: {', '.join(TOOLKITS)}")
    return TOOLKITS[name]


_pinned: Toolkit | None = None


def chosen() -> Toolkit:
    """The toolkit of this process, fixed at first use: one app must not mix two cores' objects."""
    global _pinned
    if _pinned is None:
        _pinned = select(os.environ.get(ENV))
    return _pinned


def _load(kit: Toolkit, module: str, dist: str):
    try:  # the toolkit's own modules, by the names TOOLKITS gives (importlib: a test names its own)
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # the package is there but broken: show that, not "not installed"
            raise
        raise FatpipeError(f"{ENV}={kit.name} but {dist} is not installed: {kit.install}") from None


def core():
    """The chosen toolkit's core module (`cdktf` or `cdktn`); one clear line if it is missing."""
    kit = chosen()
    return _load(kit, kit.core, kit.core)


class _Bindings:
    """A package of prebuilt provider bindings; `aws.vpc` imports `<package>.vpc` when first used."""

    def __init__(self, kit: Toolkit):
        self._package = _load(kit, kit.aws, kit.aws_dist).__name__

    def __getattr__(self, name: str):
        return importlib.import_module(f"{self._package}.{name}")


def aws_bindings() -> _Bindings:
    """The chosen toolkit's prebuilt hashicorp/aws bindings (each submodule is one resource type)."""
    return _Bindings(chosen())


def report() -> dict:
    """What `fatpipe synth` and `fatpipe config` show: the toolkit, its version, why it was chosen."""
    kit = chosen()
    found = kit.version()
    chosen_by = ENV if os.environ.get(ENV) else "default"
    why = f"{ENV}={kit.name}" if chosen_by == ENV else "the default"
    summary = (f"{kit.name} {found} ({kit.title}, {why})" if found
               else f"{kit.name}, not installed ({kit.install})")
    return {"name": kit.name, "title": kit.title, "version": found, "chosen_by": chosen_by,
            "summary": summary}


def __getattr__(name: str):
    # `from fatpipe.stacks.toolkit import App` lands here: the chosen core's class, imported late.
    if name in CORE_NAMES:
        return getattr(core(), name)
    if name == "Construct":
        return load("constructs").Construct  # shared by both toolkits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
