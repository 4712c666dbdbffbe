"""`fatpipe deploy [CLUSTER]`: apply the cluster's stack and write .fatpipe/<cluster>/outputs.json."""

from __future__ import annotations

import click

from .options import cluster_argument, console, pass_project

engine_option = click.option(
    "--engine", type=click.Choice(["terraform", "tofu", "cdktf"]), default="terraform",
    show_default=True, help="What applies the synthesized stack.",
)


yes_option = click.option("-y", "--yes", is_flag=True, help="Do not ask before creating paid cloud resources.")


def deploy_outputs(project, name: str | None, engine: str, yes: bool, verbose: bool):
    """Apply the cluster's stack, asking on the terminal before paid resources; its outputs."""
    from fatpipe.stacks.engine import deploy_cluster

    return deploy_cluster(project, name, engine=engine, yes=yes,
                          confirm=lambda question: click.confirm(question, default=False, err=True),
                          log=terraform_log(verbose))


def terraform_log(verbose: bool):
    """Echo engine output to stderr: every line with -v, else only what names a resource."""
    err = console(stderr=True)

    def log(line: str) -> None:
        if verbose or ": Creation complete" in line or ": Destruction complete" in line \
                or "Apply complete" in line or "Destroy complete" in line:
            err.print(line, style="dim", markup=False, soft_wrap=True)

    return log


@click.command()
@cluster_argument
@engine_option
@yes_option
@click.option("-v", "--verbose", is_flag=True, help="Show the engine's full output.")
@pass_project
def deploy(project, cluster: str | None, engine: str, yes: bool, verbose: bool):
    """Create the cluster's nodes and write its outputs (the input of every later command)."""
    from fatpipe.stacks.engine import outputs_path

    out = console()
    outputs = deploy_outputs(project, cluster, engine, yes, verbose)
    for node in outputs.nodes:
        where = node.netns or node.public_ip or node.transport
        out.print(f"  {node.name:<20} {node.private_ip:<15} {where}")
    out.print(f"{outputs.name}: {len(outputs.nodes)} node(s) up, "
              f"outputs in {outputs_path(project, outputs.name)}")
