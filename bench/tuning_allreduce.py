"""The guest side of bench/tuning.py: one process per VM and RTT row, joined over gloo, which runs a
phase per line read from stdin and prints one JSON line per phase.

Each phase builds a new gloo group, so its sockets are made under the sysctls the bench applied
just before (the congestion control is fixed when a socket is made), all-reduces a warm-up and
then `iters` timed buffers, and drops the group.

    python tuning_allreduce.py RANK MASTER_IP PORT NIC MIB ITERS
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time


def main() -> None:
    rank, master, port, nic, mib, iters = sys.argv[1:7]
    os.environ["GLOO_SOCKET_IFNAME"] = nic  # the guest cannot resolve its own name to this NIC
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{master}:{int(port)}", rank=int(rank), world_size=2,
                            timeout=datetime.timedelta(minutes=10))
    buffer = torch.ones(int(mib) << 18)  # fp32: 4 bytes each
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        phase = line.strip()
        if phase == "quit":
            break
        group = dist.new_group([0, 1])
        dist.all_reduce(buffer, group=group)  # warm-up: connections, slow start
        times = []
        for _ in range(int(iters)):
            dist.barrier(group=group)
            started = time.perf_counter()
            dist.all_reduce(buffer, group=group)
            times.append(time.perf_counter() - started)
        dist.destroy_process_group(group)
        print(json.dumps({"phase": phase, "times": times}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
