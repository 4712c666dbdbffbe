"""What rendezvous.json records: the run (`Rendezvous`) and each node's part of it (`NodePlan`).

Its own module so both the maker (`rendezvous.py`) and the renderer of each node's files
(`nodefiles.py`) import it, and neither imports the other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class NodePlan:
    """One node's part of a run: where it is, where its project folder is, what it runs with."""

    rank: int
    name: str
    transport: str
    private_ip: str
    public_ip: str | None
    netns: str | None
    workdir: str  # the project folder on the node (ssh: relative to the login home)
    python: str  # the interpreter that runs torchrun there
    ssh_user: str = ""
    ssh_port: int | None = None
    ssh_key_file: str | None = None
    ssh_host: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)


@dataclass
class Rendezvous:
    """Everything `rendezvous.json` records; `run_rel` is the run folder relative to a workdir."""

    run_id: str
    cluster: str
    provider: str
    nnodes: int
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    max_restarts: int
    join_timeout_s: int
    run_rel: str
    entry: list[str]
    builtin_trainer: bool
    tier_gbps: float
    created: str
    nodes: list[NodePlan]
    gpus_per_node: int = 0  # from the outputs: ssh nodes with GPUs get torch's CUDA build
    data_path: str | None = None  # [data]'s path in the project folder: the run gets FATPIPE_DATA
    # "live": each node its own torchrun and replica group; `lighthouses` (IP:PORT, in the order
    # they serve: node 0's first, `lighthouse`) each ask for `min_replicas` replica groups;
    # docs/ARCHITECTURE.md, "Live fault tolerance".
    fault_tolerance: str = "restart"
    lighthouse: str | None = None
    lighthouses: list[str] = field(default_factory=list)
    min_replicas: int = 1
    fault_why: str = ""  # why this mode (ops.rdzv.faultmode): the launch's decision line
    fault_auto: bool = False  # chosen by fault_tolerance = "auto": may fall back to restart

    @property
    def live(self) -> bool:
        return self.fault_tolerance == "live"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> Rendezvous:
        nodes = [NodePlan(**n) for n in doc["nodes"]]
        # A key this version no longer records (an older run's `ships_trainer`) is dropped.
        known = {f.name for f in fields(cls)} - {"nodes"}
        rdzv = cls(**{k: v for k, v in doc.items() if k in known}, nodes=nodes)
        if rdzv.live and not rdzv.lighthouses:  # a live run from before one Lighthouse per node
            rdzv.lighthouses = [rdzv.lighthouse]
        return rdzv
