"""`wait` reads the NIC's qdiscs from the ready marker: an ingress qdisc (a vm cluster's rtt_ms
delays the private links there) sends nothing, so it neither passes nor fails the fq check."""

from fatpipe.ops.reach.wait import profile_problems


def marker(*qdiscs: str) -> dict:
    return {"iface": "ens2", "packages": {"iperf3": True}, "qdisc": list(qdiscs)}


def test_an_ingress_qdisc_beside_fq_is_ready():
    assert profile_problems(marker("fq", "ingress")) == []
    assert profile_problems(marker("mq", "fq", "fq", "clsact")) == []


def test_an_ingress_qdisc_alone_is_not_fq():
    assert profile_problems(marker("pfifo_fast", "ingress")) == ["qdisc pfifo_fast on ens2 (want fq, or mq of fq)"]
    assert profile_problems(marker("ingress")) == ["qdisc none on ens2 (want fq, or mq of fq)"]
