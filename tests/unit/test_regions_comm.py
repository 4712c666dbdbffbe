"""The exchange between regions: int8 with a scale per chunk and error feedback against the exact
float32 mean, in real gloo processes (4 ranks in 2 regions, 2 streams per shard); the groups are
the same whatever order the ranks' regions come in; a value that is not finite drops its chunk on
every region alike and leaves no residual; and the launch's regions and streams."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fatpipe.trainer.comm.costmodel import int8_wire_bytes
from fatpipe.trainer.comm.quant import CHUNK, ErrorFeedback, dequantize, quantize

pytestmark = pytest.mark.timeout(180)


def test_int8_chunks_round_to_within_half_a_step_of_each_chunks_scale():
    torch.manual_seed(0)
    values = torch.randn(3 * CHUNK + 17) * torch.logspace(-4, 1, 3 * CHUNK + 17)
    q, scales = quantize(values)
    assert q.dtype == torch.int8 and scales.numel() == 4
    error = (dequantize(q, scales) - values).abs()
    step = scales.repeat_interleave(CHUNK)[:values.numel()]
    assert torch.all(error <= step / 2 + 1e-7)
    assert int8_wire_bytes(values.numel()) == values.numel() + 16  # 1 byte a value, 4 per chunk


def test_error_feedback_carries_what_rounding_dropped_into_the_next_exchange():
    torch.manual_seed(1)
    feedback, sent, exact = ErrorFeedback(), torch.zeros(CHUNK), torch.zeros(CHUNK)
    for _ in range(50):
        values = torch.randn(CHUNK) * 1e-3
        exact += values
        sent += dequantize(*feedback.quantize(values))
    # With feedback the sum sent trails the exact sum by what the last rounding kept back, no
    # more: the rounding errors of 50 exchanges do not add up.
    assert torch.allclose(sent + feedback.residual, exact, atol=1e-6)
    scale = exact.abs().max() / 127
    assert (sent - exact).abs().max() <= scale


def test_a_value_that_is_not_finite_sends_its_chunk_as_zeros_and_leaves_no_residual():
    feedback, values = ErrorFeedback(), torch.randn(3 * CHUNK)
    values[CHUNK + 1], values[2 * CHUNK + 2] = float("nan"), float("inf")
    q, scales = feedback.quantize(values)
    assert torch.isfinite(scales).tolist() == [True, False, False]
    assert torch.all(q[CHUNK:] == 0) and torch.all(dequantize(q, scales)[CHUNK:] == 0)
    assert torch.isfinite(feedback.residual).all() and torch.all(feedback.residual[CHUNK:] == 0)
    # The next exchange of finite values is sent whole.
    q, scales = feedback.quantize(torch.ones(3 * CHUNK))
    assert torch.isfinite(scales).all() and torch.isfinite(feedback.residual).all()


def _worker(rank: int, labels: list[str], port: int, queue, read) -> None:
    from fatpipe.trainer.comm.regions import CrossExchange, region_layout

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=len(labels))
    layout = region_layout(torch.device("cpu"), labels[rank], streams=2)
    # Every rank of a region holds the same tensor (DDP's replicas); regions differ.
    region = layout.regions.index(labels[rank])
    torch.manual_seed(100 + region)
    flat = torch.randn(5 * CHUNK + 3)
    exchange = CrossExchange(layout, torch.device("cpu"))
    mean = exchange.mean(flat.clone())
    queue.put((rank, labels[rank], layout.shard, len(layout.cross_groups), mean, flat, exchange.sent_bytes))
    read.wait(150)  # a queued tensor is a file descriptor this process serves until it was read
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("labels", [["r0", "r0", "r1", "r1"], ["east", "west", "west", "east"]])
def test_the_int8_mean_between_regions_is_the_exact_mean_within_rounding(labels):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    read = ctx.Event()
    procs = [ctx.Process(target=_worker, args=(r, labels, port, queue, read)) for r in range(len(labels))]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=150) for _ in procs)
    read.set()
    for p in procs:
        p.join(30)
    by_region = {label: flat for _, label, _, _, _, flat, _ in results}
    exact = sum(by_region.values()) / len(by_region)
    means = [mean for *_, mean, _, _ in results]
    for mean in means:
        assert torch.equal(mean, means[0])  # every rank applies the same outer step
    # One rounding of each region's values: half a step of the chunk's scale, averaged.
    assert (means[0] - exact).abs().max() < 0.02
    assert sorted(shard for _, _, shard, _, _, _, _ in results) == [0, 0, 1, 1]
    assert all(streams == 2 for _, _, _, streams, _, _, _ in results)
    # Each rank sent its shard (half of its region's tensor) to the other region, as int8.
    half = -(-len(exact) // 2)
    assert sorted(sent for *_, sent in results) == sorted(
        [int8_wire_bytes(half)] * 2 + [int8_wire_bytes(len(exact) - half)] * 2)


def _nonfinite_worker(rank: int, port: int, queue, read) -> None:
    """Two regions of one rank each; region r0's pseudo-gradient holds a NaN in chunk 1 and an
    inf in chunk 3 at the first exchange, every value finite at the second."""
    from fatpipe.trainer.comm.regions import CrossExchange, region_layout

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    layout = region_layout(torch.device("cpu"), f"r{rank}")
    exchange = CrossExchange(layout, torch.device("cpu"))
    torch.manual_seed(200 + rank)
    first, second = torch.randn(4 * CHUNK + 5), torch.randn(4 * CHUNK + 5)
    if rank == 0:
        first[CHUNK + 7], first[3 * CHUNK] = float("nan"), float("-inf")
    means = [exchange.mean(first.clone())]
    residual = exchange.feedback.residual.clone()
    means.append(exchange.mean(second.clone()))
    queue.put((rank, first, second, means, residual, exchange.dropped_chunks))
    read.wait(150)
    dist.barrier()
    dist.destroy_process_group()


def test_a_chunk_that_is_not_finite_is_dropped_alike_everywhere_and_its_residual_with_it():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    read = ctx.Event()
    procs = [ctx.Process(target=_nonfinite_worker, args=(r, port, queue, read)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=150) for _ in procs)
    read.set()
    for p in procs:
        p.join(30)
    (_, first0, second0, means0, residual0, dropped0), (_, first1, second1, means1, residual1, dropped1) = results
    # Both regions apply the same outer step, and it is finite.
    assert all(torch.equal(a, b) for a, b in zip(means0, means1, strict=True))
    assert all(torch.isfinite(m).all() for m in means0)
    # Chunks 1 and 3 count zero from both regions; the others are the mean within rounding.
    bad = torch.zeros(first0.numel(), dtype=torch.bool)
    bad[CHUNK:2 * CHUNK] = bad[3 * CHUNK:4 * CHUNK] = True
    assert torch.all(means0[0][bad] == 0)
    exact = (first0 + first1) / 2
    assert (means0[0][~bad] - exact[~bad]).abs().max() < 0.02
    # The residuals stay finite (none of the bad value is carried on), and the dropped chunks'
    # are zero on both sides: the next exchange is the plain mean again.
    for residual in (residual0, residual1):
        assert torch.isfinite(residual).all() and torch.all(residual[bad] == 0)
    assert (means0[1] - (second0 + second1) / 2).abs().max() < 0.05
    assert dropped0 == dropped1 == 2


def test_the_runs_summary_shows_the_chunks_dropped_between_regions(tmp_path):
    from rich.console import Console

    from fatpipe.cli.render import summary_table
    from fatpipe.ops.run.summary import run_summary

    console = Console(width=200, record=True)
    for dropped in (0, 2):
        (tmp_path / "summary.json").write_text(json.dumps({
            "steps": 40, "regions": {"regions": ["r0", "r1"], "nonfinite_chunks_dropped": dropped}}))
        doc = run_summary(tmp_path, tier_gbps=1)
        assert doc["nonfinite_chunks_dropped"] == dropped
        console.print(summary_table(doc))
    text = console.export_text()
    assert text.count("dropped between regions") == 1 and "2 int8 chunk(s) not finite" in text


def test_the_launch_takes_netchecks_grouping_and_splits_a_capped_link(tmp_path):
    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.ops.rdzv.regionenv import region_env

    nodes = [{"name": f"c-{i}", "private_ip": f"10.1.0.{10 + i}", "transport": "local", "region": r}
             for i, r in enumerate(["r0", "r0", "r1", "r1"])]
    outputs = parse_outputs({"name": "c", "provider": "sim", "tier_gbps": 10, "private_cidr": "10.1.0.0/24",
                             "nodes": nodes})
    # Declared only: the regions, one stream.
    env = region_env(outputs, tmp_path)
    assert env["c-2"] == {"FATPIPE_REGION": "r1", "FATPIPE_CROSS_STREAMS": "1"}
    # netcheck measured c-1 with c-2 and c-3 (the declared grouping is wrong), and one flow
    # between regions at a quarter of four's rate.
    links = [{"a": "c-0", "b": "c-1", "gbps_by_streams": {"1": 0.05, "4": 0.19}},
             {"a": "c-2", "b": "c-3", "gbps_by_streams": {"1": 9.0, "4": 9.4}}]
    doc = {"regions": {"groups": [["c-0"], ["c-1", "c-2", "c-3"]]}, "pairs": {"links": links}}
    (tmp_path / "netcheck.json").write_text(json.dumps(doc))
    env = region_env(outputs, tmp_path)
    assert {name: e["FATPIPE_REGION"] for name, e in env.items()} == {"c-0": "r0", "c-1": "r1", "c-2": "r1", "c-3": "r1"}
    assert {e["FATPIPE_CROSS_STREAMS"] for e in env.values()} == {"4"}
    # One region: no variables, the run is flat.
    one = parse_outputs({**outputs.model_dump(), "nodes": [{**n, "region": None} for n in nodes]})
    assert region_env(one, tmp_path / "none") == {}


@pytest.mark.parametrize("region", ["r0; rm -rf /", "../r1", "$(reboot)", "R0"])
def test_a_region_the_outputs_name_never_reaches_a_node_unchecked(region):
    # FATPIPE_REGION is written into the node's env file: a region outside [a-z0-9-] is refused
    # when the outputs are read, before anything is written.
    from fatpipe.infra.errors import FatpipeError
    from fatpipe.infra.outputs import parse_outputs

    nodes = [{"name": f"c-{i}", "private_ip": f"10.1.0.{10 + i}", "transport": "local", "region": region}
             for i in range(2)]
    with pytest.raises(FatpipeError, match="region"):
        parse_outputs({"name": "c", "provider": "sim", "tier_gbps": 10, "private_cidr": "10.1.0.0/24",
                       "nodes": nodes})
