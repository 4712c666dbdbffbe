"""Shared defaults and vocabulary, defined once: every command, the stacks and the node tools use these."""

from __future__ import annotations

# What applies a synthesized stack (`--engine`).
ENGINES = ("terraform", "tofu", "cdktf")
DEFAULT_ENGINE = "terraform"

# How netcheck measures node-to-node TCP (`--p2p-tool`): iperf3 where every node has it, else
# the built-in socket test. The trainer's p2p module keeps its own copy (it imports nothing of
# fatpipe beyond the trainer); a unit test ties the two.
P2P_TOOLS = ("auto", "iperf3", "socket")

# torchrun settings of a run (`fatpipe launch`, `up`, `rendezvous`, `train`).
JOIN_TIMEOUT_S = 180  # every node must join the rendezvous within this
MAX_RESTARTS = 3  # restarts of the whole worker group after a failure
# A benchmark is a measurement, not a job to finish: a restart would only mix two runs' numbers.
BENCH_MAX_RESTARTS = 0
# The ports a run listens on from `rdzv_port`, per node: under live a node's torchrun store,
# Lighthouse and relay (`ops.rdzv.nodefiles.live_port`); otherwise the rendezvous, netcheck's
# point-to-point port and the data chain's. The host firewall lets only the nodes reach them.
RUN_PORTS_PER_NODE = 3

WAIT_TIMEOUT_S = 600  # `fatpipe wait`: every node ready within this
# A followed run's node out of reach this long ends the follow (never the run): `launch`, `up`, `logs -f`.
UNREACHABLE_TIMEOUT_S = 300

# Files of a run folder (.fatpipe/<cluster>/runs/<run-id>/).
RENDEZVOUS_FILE = "rendezvous.json"
SUMMARY_FILE = "summary.json"
NETCHECK_FILE = "netcheck.json"
FAULTS_FILE = "faults.json"  # the trainer's fault counts and failures (a copy of trainer.faults')
NETCHECK_PLOT = "netcheck.png"
UP_REPORT_FILE = "up.json"
TORCHRUN_DIR = "torchrun"  # torchrun's --log-dir per node: each worker's error file (ops.run.rootcause)
# The group rank torch's rendezvous gave node <index> (docs/ARCHITECTURE.md, "Rendezvous"): its
# worker of local rank 0 writes it as it starts (trainer.noderank), `ops.run.leader` reads it.
GROUP_RANK_FILE = "node-{index}.group-rank"
