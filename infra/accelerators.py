"""What computes on a node in `fatpipe plan`: each GPU kind's sourced GPT-2 124M training throughput.

A figure is measured (a public run of GPT-2 124M, its source named) or derived from a measured
one by the vendors' datasheets, and then its source string says so and gives every number used.
The rule for a derived figure: a training step of GPT-2 124M mixes matrix math, which scales
with the dense bf16 tensor TFLOPS, and memory-bound kernels (layer norms, GELU, softmax, AdamW),
which scale with the memory bandwidth; so the step's speed-up over a measured GPU lies between
the two ratios, and the planner takes the lower one (`derive`). The measured A100 and H100 fall
inside their bounds derived from the RTX 4090 (tests/unit/test_plan_accelerators.py).

A kind is the catalogs' `gpu_kind` (`infra.catalog.gpu_kind`): a machine type is planned at
its own GPU's figure, and a GPU without one here is left unranked, never guessed
(`node_accelerator`, `missing_figure`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .catalog import MachineType
from .errors import ConfigError

# llm.c's GPT-2 124M (vocabulary padded to 50,304): the model every throughput below was measured on.
REFERENCE_PARAMS = 124_475_904


@dataclass(frozen=True)
class Accelerator:
    """What computes on one node, and its sourced training throughput on REFERENCE_PARAMS."""

    name: str
    tokens_per_s: float  # per GPU, or per vCPU when per_vcpu
    source: str
    gpus: int = 1  # GPUs a machine type must have (0: the CPU case)
    per_vcpu: bool = False
    kind: str = ""  # its key in ACCELERATORS, the catalogs' gpu_kind ("" for one made elsewhere)

    def count_on(self, machine: MachineType) -> int:
        """How many of it a node of `machine` computes with: every GPU (data parallel inside the
        node too), or every vCPU; a node of unknown size (a --link) counts as one."""
        return max(machine.vcpus if self.per_vcpu else machine.gpus, 1)

    def ranks_on(self, machine: MachineType) -> int:
        """Trainer processes on such a node: one per GPU (torchrun's nproc_per_node), one on CPUs."""
        return 1 if self.gpus == 0 else self.count_on(machine)

    def node_tokens_per_s(self, params: int, machine: MachineType | None = None) -> float:
        """Tokens/s of one node training a model of `params`: compute ~ 6 x params x tokens."""
        rate = self.tokens_per_s * REFERENCE_PARAMS / params
        return rate if machine is None else rate * self.count_on(machine)


@dataclass(frozen=True)
class Datasheet:
    """A GPU's vendor figures: dense (no sparsity) bf16 tensor TFLOPS with FP32 accumulate, fp16
    where the GPU has no bf16; and its memory bandwidth in GB/s."""

    tflops: float
    memory_gbs: float
    source: str


DATASHEETS: dict[str, Datasheet] = {
    "rtx4090": Datasheet(165.2, 1008, "NVIDIA Ada Lovelace GPU architecture whitepaper: GeForce "
                         "RTX 4090 165.2 dense BF16 tensor TFLOPS with FP32 accumulate, 1,008 GB/s"),
    "t4": Datasheet(65, 320, "NVIDIA T4 datasheet: 65 TFLOPS FP16/FP32 mixed precision, 320 GB/s "
                    "(Turing has no bf16: the figure is fp16's, and fatpipe's trainer autocasts to "
                    "bf16, trainer/torchstate.py, which a T4 runs without tensor cores: expect less)"),
    "a10g": Datasheet(70, 600, "NVIDIA publishes no A10G datasheet: 70 dense BF16 tensor TFLOPS "
                      "and 600 GB/s from Baseten, 'NVIDIA A10 vs A10G for ML model inference' "
                      "(the A10 has 125)"),
    "l4": Datasheet(121, 300, "NVIDIA L4 datasheet: 242 BF16 tensor TFLOPS with sparsity, 121 "
                    "dense, 300 GB/s"),
    "l40s": Datasheet(362.05, 864, "NVIDIA L40S datasheet: 733 BF16 tensor TFLOPS with sparsity, "
                      "362.05 dense, 864 GB/s"),
    "a100": Datasheet(312, 1555, "NVIDIA A100 datasheet: 312 dense BF16 tensor TFLOPS; A100 40GB "
                      "1,555 GB/s"),
    "a100-80gb": Datasheet(312, 2039, "NVIDIA A100 datasheet: 312 dense BF16 tensor TFLOPS; A100 "
                           "80GB SXM 2,039 GB/s"),
    "h100": Datasheet(989, 3350, "NVIDIA H100 datasheet: H100 SXM 1,979 BF16 tensor TFLOPS with "
                      "sparsity, 989 dense, 3.35 TB/s"),
}


def derive(kind: str, name: str, reference: Accelerator) -> Accelerator:
    """`kind`'s figure from a measured GPU's: its tokens/s times the lower of the two datasheet
    ratios (dense TFLOPS, memory bandwidth), the source string giving every number."""
    sheet, ref = DATASHEETS[kind], DATASHEETS[reference.kind]
    compute, memory = sheet.tflops / ref.tflops, sheet.memory_gbs / ref.memory_gbs
    low, high = (reference.tokens_per_s * r for r in sorted((compute, memory)))
    return Accelerator(name, low, (
        f"derived, not measured: {reference.name}'s {reference.tokens_per_s:,.0f} tokens/s x "
        f"{min(compute, memory):.3f}, the lower of the dense TFLOPS ratio {sheet.tflops:g}/"
        f"{ref.tflops:g} = {compute:.3f} and the memory bandwidth ratio {sheet.memory_gbs:g}/"
        f"{ref.memory_gbs:g} GB/s = {memory:.3f} (a step scales between the two; the higher gives "
        f"{high:,.0f}). {sheet.source}. {ref.source}"), kind=kind)


# Measured: public GPT-2 124M training runs.
RTX4090 = Accelerator(
    "RTX 4090", 220.7e3 / 2,
    "measured: llm.c's PyTorch GPT-2 trainer on 2x RTX 4090, 220.7k tokens/s (T. Romero, NanoGPT "
    "Speedrun Living Worklog, record 1)", kind="rtx4090")
A100_80GB = Accelerator(
    "A100 80GB", 524_288 / 0.300 / 8,
    "measured: llm.c (github.com/karpathy/llm.c, scripts/run_gpt2_124M.sh) on 8x A100 80GB SXM, "
    "524,288 tokens per step in ~300 ms (1.75M tokens/s a node); the run of llm.c discussion #481 "
    "took ~90 minutes for 10B tokens", kind="a100-80gb")
H100 = Accelerator(
    "H100", 10e9 / (45 * 60) / 8,
    "measured: llm.c GPT-2 124M on 8x H100 SXM, 10B tokens in 45 minutes (modded-nanogpt's "
    "record table, record 1: the llm.c baseline)", kind="h100")

# The figures docs/clouds-and-plan.md tabulates, with their sources; a kind the catalogs name
# that is missing here (v100, h200, b200, ...) is marked and left unranked.
ACCELERATORS: dict[str, Accelerator] = {
    "rtx4090": RTX4090,
    "t4": derive("t4", "T4", RTX4090),
    "a10g": derive("a10g", "A10G", RTX4090),
    "l4": derive("l4", "L4", RTX4090),
    "l40s": derive("l40s", "L40S", RTX4090),
    "a100": derive("a100", "A100 40GB", A100_80GB),
    "a100-80gb": A100_80GB,
    "h100": H100,
    # The seed table's sim: the `tiny` preset (829,750 parameters, 3.319 MB of gradients) at
    # 98.6 ms per step of 512 tokens per rank, 4 ranks on 2 vCPUs: 10,385 tokens/s per vCPU,
    # i.e. 69 tokens/s per vCPU on REFERENCE_PARAMS. A CPU node's rate grows with its vCPUs.
    "cpu": Accelerator(
        "CPU", 4 * 512 / 0.0986 / 2 * 829_750 / REFERENCE_PARAMS,
        "docs/BENCHMARKS.md, the seed table's sim compute: tiny preset, 98.6 ms/step, 4 ranks "
        "on 2 vCPUs, torch 2.13 CPU", gpus=0, per_vcpu=True, kind="cpu"),
}

# A node the catalogs do not describe (a --link, a declared sim, ssh or vm cluster) is taken to
# carry the seed's card, one per GPU it declares (at least one), unless --accelerator names another.
OUTSIDE_CATALOG_GPU = "rtx4090"


def accelerator(name: str | None, tokens_per_s: float | None = None) -> Accelerator | None:
    """The accelerator `--accelerator NAME` forces on every node, `tokens_per_s` (the user's own
    figure for GPT-2 124M) replacing its own; alone, that figure for every GPU. None: neither,
    so each machine computes with its own (`node_accelerator`)."""
    if name is not None and name not in ACCELERATORS:
        raise ConfigError(f"unknown accelerator {name!r}; known: {', '.join(ACCELERATORS)}")
    if tokens_per_s is None:
        return None if name is None else ACCELERATORS[name]
    if not tokens_per_s > 0 or math.isinf(tokens_per_s):
        raise ConfigError(f"--tokens-per-s must be a positive number, not {tokens_per_s!r}")
    found = ACCELERATORS[name] if name is not None else Accelerator("your GPU", 0.0, "", kind="given")
    return Accelerator(found.name, tokens_per_s, "given (--tokens-per-s)", found.gpus,
                       found.per_vcpu, found.kind)


def node_accelerator(machine: MachineType, forced: Accelerator | None = None) -> Accelerator | None:
    """What computes on a node of `machine`: `forced` (--accelerator) when given, else the
    type's own GPU at its sourced figure, else, without a GPU, its vCPUs. None: its GPU has no
    sourced figure here (`missing_figure` says why): the planner marks it and ranks it not."""
    if forced is not None:
        return forced
    if machine.gpu_kind:
        return ACCELERATORS.get(machine.gpu_kind) if machine.gpus >= 1 else None
    return ACCELERATORS["cpu"] if machine.gpus == 0 else None


def missing_figure(machine: MachineType) -> str:
    """Why `node_accelerator` found nothing for `machine`."""
    if not machine.gpu_kind:
        return (f"the catalog does not say which GPU its {machine.gpus} GPU(s) are (written before "
                "kinds were recorded: refresh it with `fatpipe catalog`)")
    name = machine.gpu_name or machine.gpu_kind
    if machine.gpus < 1:
        return f"a share of one {name}, not a whole GPU"
    return f"no sourced figure for {name} ({machine.gpu_kind})"
