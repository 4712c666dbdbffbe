"""The job `fatpipe plan` prices: what one step computes per node, and what each link carries.

Pure arithmetic on published figures, before anything is deployed:

- compute: the node's accelerators (by default the machine type's own GPUs, `infra.accelerators`)
  at their sourced tokens/s for GPT-2 124M, scaled to another model by parameter count
  (training compute ~ 6 x params x tokens, so tokens/s ~ 1 / params);
- the link: a machine type's **baseline** bandwidth from its catalog (never the burst), capped
  by what the planned flows can carry (AWS caps one TCP flow; gloo opens one flow per peer,
  NCCL's socket transport as many as the tier's profile sets) and, for nodes in different
  regions or reached over the internet, by the provider's egress cap;
- the traffic: a ring all-reduce of the gradient over the N nodes sends 2 x (N-1)/N x bytes per
  node. A node of G GPUs runs G ranks, which sum their gradients over the node's own path first
  (`IN_NODE_GBPS`): the private link carries the ring of N nodes, not of N x G ranks.

The comm method, its exposed share and the step time come from the trainer's own comm=auto
model, applied by `ops.plan.plan` (the model layer imports no trainer, docs/ARCHITECTURE.md, "Layers").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# What computes on a node lives in `infra.accelerators`; its names are imported from here too.
from .accelerators import ACCELERATORS as ACCELERATORS
from .accelerators import REFERENCE_PARAMS as REFERENCE_PARAMS
from .accelerators import Accelerator
from .accelerators import accelerator as accelerator
from .catalog import MachineType
from .errors import ConfigError
from .tiers import NCCL_SOCKETS

# llm.c's GPT-2 124M batch: 0.5M tokens per optimizer step, shared by every node.
DEFAULT_TOKENS_PER_STEP = 524_288


@dataclass(frozen=True)
class Job:
    """A training job: the model's size, how many tokens, how many per optimizer step."""

    params: int
    tokens: int  # to train on, in all
    tokens_per_step: int = DEFAULT_TOKENS_PER_STEP  # global batch, shared by every node
    warmup_steps: int | None = None  # LR warm-up (PowerSGD sends plain until then); None: the trainer's

    def __post_init__(self):
        for name in ("params", "tokens", "tokens_per_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"job: {name} must be a positive integer, not {value!r}")

    @property
    def steps(self) -> int:
        return math.ceil(self.tokens / self.tokens_per_step)

    @property
    def grad_bytes(self) -> int:
        return 4 * self.params  # float32 gradients, as DDP's buckets hold them

    def compute_s(self, accel: Accelerator, nodes: int, machine: MachineType | None = None) -> float:
        """One step's compute on each node: its share of the batch at its tokens/s."""
        return self.tokens_per_step / nodes / accel.node_tokens_per_s(self.params, machine)


# The GPUs inside a node reduce over NVLink or PCIe, not over the private link, and that sum is
# not counted: its path is faster than the link. The slowest, PCIe 3.0 x16 (g4dn's T4s), carries
# 15.75 GB/s a direction, 126 Gbit/s, above every link of the shipped catalogs' GPU types (100 at
# most); PCIe 4.0 x16 (g5, g6, g6e) 252, above the 160 that 16 NCCL flows of 10 carry on AWS;
# NVLink (p4d, p5) 600-900 GB/s.
IN_NODE_GBPS = 126.0


def ring_allreduce_bytes(grad_bytes: int, nodes: int) -> float:
    """Bytes each node sends (and receives) in a ring all-reduce over `nodes` nodes (its GPUs
    having summed theirs inside it): 2 x (N-1)/N x the message."""
    return 2 * (nodes - 1) / nodes * grad_bytes if nodes > 1 else 0.0


# -- the link -------------------------------------------------------------------------------------

# AWS caps one TCP flow at 5 Gbit/s between instances outside a cluster placement group and
# 10 Gbit/s inside one ("Amazon EC2 instance network bandwidth", EC2 User Guide). fatpipe puts
# AWS nodes in a cluster placement group when the type may join one (`cluster_placement`).
# DigitalOcean documents no per-flow limit.
AWS_FLOW_GBPS = {True: 10.0, False: 5.0}


def flow_cap_gbps(provider: str, machine: MachineType, span: str = "region") -> float | None:
    """The most one TCP flow carries between two nodes of this type; None: no published cap.
    No placement group spans regions or the internet."""
    if provider == "aws":
        return AWS_FLOW_GBPS[machine.cluster_placement and span == "region"]
    return None


# Where the ring's traffic goes: inside one region (the private network), between regions, or
# over the internet (public addresses). Outside its region AWS caps an instance's multi-flow
# traffic at 5 Gbit/s below 32 vCPUs, else at half its bandwidth or 5, whichever is larger
# ("Amazon EC2 instance network bandwidth", EC2 User Guide: traffic to other Regions, an
# internet gateway, Direct Connect or local gateways). DigitalOcean publishes no egress cap
# beyond the per-Droplet limit its catalog already holds.
SPANS = ("region", "regions", "internet")
AWS_EGRESS_GBPS, AWS_EGRESS_MIN_VCPUS, AWS_EGRESS_SHARE = 5.0, 32, 0.5


def egress_cap_gbps(provider: str, machine: MachineType, span: str = "region") -> float | None:
    """What all of a node's flows together carry out of its region; None: no published cap."""
    if span not in SPANS:
        raise ConfigError(f"span must be one of {', '.join(SPANS)}, not {span!r}")
    if span == "region" or provider != "aws":
        return None
    if machine.vcpus >= AWS_EGRESS_MIN_VCPUS and machine.baseline_gbps is not None:
        return max(AWS_EGRESS_SHARE * machine.baseline_gbps, AWS_EGRESS_GBPS)
    return AWS_EGRESS_GBPS


# NCCL recognises AWS's ENA and opens 2 threads x 8 sockets per peer by itself; fatpipe leaves
# NCCL's socket settings alone there (stacks/providers/aws.py), and sets the tier's elsewhere.
AWS_NCCL_FLOWS = 2 * 8


def flows_per_peer(accel: Accelerator, tier: str, provider: str = "") -> int:
    """Flows one node opens to its ring neighbour: gloo (CPU) one; NCCL its sockets."""
    if accel.gpus == 0:
        return 1
    if provider == "aws":
        return AWS_NCCL_FLOWS
    threads, sockets = NCCL_SOCKETS[tier]
    return threads * sockets


@dataclass(frozen=True)
class Link:
    """What a node pair sustains: the baseline, capped by the flows the job opens."""

    gbps: float  # what the all-reduce gets
    baseline_gbps: float
    flow_cap_gbps: float | None  # the cap of all the flows together (and egress); None: none published
    burst_only: bool  # the advertised rate is mostly burst: baseline under half of it
    tier_unreachable: bool  # the planned flows cannot carry the tier's rate


def plan_link(provider: str, machine: MachineType, accel: Accelerator, tier: str,
              tier_gbps: float, span: str = "region") -> Link:
    """The link a job gets between two nodes of `machine` at `tier` (baseline, never burst),
    its ring's traffic staying in one region or crossing regions or the internet (`span`)."""
    if machine.baseline_gbps is None:
        raise ConfigError(f"{provider} {machine.name}: the catalog has no baseline bandwidth")
    baseline = machine.baseline_gbps
    one_flow = flow_cap_gbps(provider, machine, span)
    caps = [c for c in (one_flow * flows_per_peer(accel, tier, provider) if one_flow is not None else None,
                        egress_cap_gbps(provider, machine, span)) if c is not None]
    cap = min(caps) if caps else None
    gbps = min(baseline, cap) if cap is not None else baseline
    burst_only = bool(machine.peak_gbps) and baseline < 0.5 * machine.peak_gbps
    return Link(gbps, baseline, cap, burst_only, cap is not None and cap < tier_gbps)
