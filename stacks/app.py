"""Build the CDK app: one ClusterStack per cluster of the project, synthesized in-process with the
chosen toolkit (cdktf or cdktn: `stacks.toolkit`)."""

from __future__ import annotations

import os
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from . import toolkit  # the CDK's names, each imported on first use (`toolkit.__getattr__`)
from .providers import provider_for

# jsii warns on every start that this Node is past its end of life; the synthesized JSON is
# the same, and the banner would bury fatpipe's own output. The variable lists Node majors.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

OUTDIR = "cdktf.out"


def state_path_from_stack_dir(cluster_name: str) -> str:
    """The local state file, relative to cdktf.out/stacks/<name>/ where terraform runs."""
    return f"../../../.fatpipe/{cluster_name}/terraform.tfstate"


def cluster_stack_class():
    """TerraformStack, naming each element by its own id.

    cdktf (and cdktn alike) names a resource nested in a construct `<construct>_<id>_<hash>`;
    fatpipe's ids are unique within a stack, and plain names (`aws_instance.nodes`) read well in
    plans and keep state addresses stable whichever construct builds them.
    """
    class ClusterStack(toolkit.TerraformStack):
        def _allocate_logical_id(self, element) -> str:
            return element.node.id

    return ClusterStack


def build_stack(app, cluster, project):
    """A stack for `cluster`: its backend, its provider's cluster construct, one `cluster` output."""
    stack = cluster_stack_class()(app, cluster.name)
    backend = cluster.backend
    if backend.type == "s3":
        toolkit.S3Backend(
            stack,
            bucket=backend.bucket,
            key=backend.key or f"fatpipe/{project.project_id}/{cluster.name}.tfstate",
            region=backend.region or cluster.region,
            encrypt=True,
        )
        if backend.use_lockfile:
            # cdktf 0.21's S3Backend predates S3-native locking (terraform/tofu >= 1.10): set it
            # raw, which gives the same JSON with cdktn (whose S3Backend has it).
            stack.add_override("terraform.backend.s3.use_lockfile", True)
    else:
        toolkit.LocalBackend(stack, path=state_path_from_stack_dir(cluster.name))
    stack.add_override("terraform.required_version", f">= {backend.minimum_terraform}")
    provider = provider_for(cluster.provider)
    resources = provider.construct(stack, cluster, project)
    # The nodes' NCCL settings travel with the outputs: every run's rendezvous sets them.
    output = {**resources.output, "nccl": provider.nccl_env(cluster)}
    toolkit.TerraformOutput(stack, "cluster", value=output,
                    description="fatpipe cluster contract (docs/ARCHITECTURE.md)")
    return stack


def build_app(project, clusters: list | None = None, outdir: Path | None = None):
    """An App holding the stacks of `clusters`, the command's resolved specs (every declared one
    when None)."""
    outdir = outdir or project.root / OUTDIR
    app = toolkit.App(outdir=str(outdir), skip_validation=False)
    for cluster in clusters or list(project.clusters.values()):
        build_stack(app, cluster, project)
    return app


def synth(project, clusters: list | None = None, outdir: Path | None = None) -> dict[str, Path]:
    """Synthesize and return each cluster's stack folder (which holds cdk.tf.json), by name."""
    outdir = Path(outdir or project.root / OUTDIR)
    clusters = clusters or list(project.clusters.values())
    app = build_app(project, clusters, outdir)
    app.synth()
    folders = {cluster.name: outdir / "stacks" / cluster.name for cluster in clusters}
    for name, folder in folders.items():
        if not (folder / "cdk.tf.json").is_file():
            raise FatpipeError(f"synth wrote no {folder / 'cdk.tf.json'} for cluster {name}")
    return folders
