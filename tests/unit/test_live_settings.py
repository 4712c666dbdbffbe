"""What a live run reads from its node's environment, and the Lighthouse's bind address: a bad
value is one line naming it; nothing becomes a bind address that is not an IP address."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fatpipe.trainer.config import ConfigError, TrainConfig, parse_config
from fatpipe.trainer.live.lighthouse import main as lighthouse_main
from fatpipe.trainer.live.manager import host_in_url, settings_from_env
from fatpipe.trainer.live.quorum import bind_address
from fatpipe.trainer.live.runplan import live_comm

GOOD = {"FATPIPE_LIVE_LIGHTHOUSE": "10.0.0.1:29510", "FATPIPE_PRIVATE_IP": "10.0.0.2",
        "FATPIPE_NODE_NAME": "fw-a-1", "FATPIPE_NODE_RANK": "1", "FATPIPE_NODES": "3",
        "MASTER_PORT": "29400"}


def test_the_settings_of_a_node():
    s = settings_from_env(GOOD)
    assert (s.lighthouse_url, s.private_ip, s.replica_id) == ("http://10.0.0.1:29510",
                                                               "10.0.0.2", "fw-a-1")
    assert (s.node_rank, s.nodes, s.store_port, s.manager_port) == (1, 3, 29400, 0)


@pytest.mark.parametrize("key, value, named", [
    ("FATPIPE_LIVE_LIGHTHOUSE", "", "FATPIPE_LIVE_LIGHTHOUSE"),
    ("FATPIPE_LIVE_LIGHTHOUSE", "lighthouse.example:29510", "FATPIPE_LIVE_LIGHTHOUSE"),
    ("FATPIPE_LIVE_LIGHTHOUSE", "10.0.0.1:99999", "FATPIPE_LIVE_LIGHTHOUSE"),
    ("FATPIPE_LIVE_LIGHTHOUSE", "10.0.0.1:$(reboot)", "FATPIPE_LIVE_LIGHTHOUSE"),
    ("FATPIPE_PRIVATE_IP", "0.0.0.0; rm -rf /", "FATPIPE_PRIVATE_IP"),
    ("FATPIPE_NODE_NAME", "a b", "FATPIPE_NODE_NAME"),
    ("FATPIPE_NODE_NAME", "../x", "FATPIPE_NODE_NAME"),
    ("FATPIPE_NODE_RANK", "3", "FATPIPE_NODE_RANK"),
    ("FATPIPE_NODES", "x", "FATPIPE_NODE_RANK"),
    ("MASTER_PORT", "0", "MASTER_PORT"),
    ("FATPIPE_LIVE_PORT", "70000", "FATPIPE_LIVE_PORT"),
    # Where the node's servers bind and what its Manager dials: one machine's address, never
    # every interface's nor a group's.
    ("FATPIPE_PRIVATE_IP", "0.0.0.0", "every interface"),
    ("FATPIPE_PRIVATE_IP", "::", "every interface"),
    ("FATPIPE_PRIVATE_IP", "239.1.2.3", "multicast"),
    ("FATPIPE_PRIVATE_IP", "255.255.255.255", "broadcast"),
    ("FATPIPE_LIVE_LIGHTHOUSE", "0.0.0.0:29510", "every interface"),
    ("FATPIPE_LIVE_LIGHTHOUSE", "[::]:29510", "every interface"),
    ("FATPIPE_LIVE_LIGHTHOUSE", "[ff02::1]:29510", "multicast"),
])
def test_a_bad_value_is_one_line_naming_it(key, value, named):
    with pytest.raises(ConfigError) as e:
        settings_from_env({**GOOD, key: value})
    assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "224.0.0.1", "ff02::1", "255.255.255.255"])
def test_the_lighthouse_never_binds_every_interface_nor_a_group(host, capsys):
    with pytest.raises(ValueError):
        bind_address(host, 29510)
    assert lighthouse_main(["--host", host, "--port", "29510"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"lighthouse: error: --host {host} is ")
    assert "not one machine's" in line or "every interface" in line
    assert lighthouse_main(["--relay-port", "29512", "--lighthouses", f"{host_in_url(host)}:29510"]) == 2
    assert "--lighthouses" in capsys.readouterr().err
    assert settings_from_env({**GOOD, "FATPIPE_PRIVATE_IP": "127.0.0.10"}).private_ip == "127.0.0.10"  # loopback sim nodes


@pytest.mark.parametrize("text", ["0.0.0.0", "::", "224.0.0.1", "ff02::1", "255.255.255.255", "240.0.0.7",
                                  "10.0.0.1", "127.0.0.1", "::1", "fd00::2"])
def test_the_trainer_and_the_model_refuse_the_same_addresses_in_the_same_words(text):
    import ipaddress

    from fatpipe.infra.hostvalues import one_host_problem
    from fatpipe.trainer.live.quorum import one_host_ip

    try:
        one_host_ip(text)
        said = None
    except ValueError as e:
        said = str(e)
    assert said == one_host_problem(ipaddress.ip_address(text))


def test_ipv6_addresses_are_bracketed():
    assert bind_address("fd00::2", 29510) == "[fd00::2]:29510"
    assert bind_address("10.0.0.2", 29510) == "10.0.0.2:29510"
    assert host_in_url("fd00::2") == "[fd00::2]"


def test_the_lighthouse_refuses_a_host_that_is_not_an_address(capsys):
    assert lighthouse_main(["--host", "example.com", "--port", "29510"]) == 2
    assert "not an IP address" in capsys.readouterr().err


def test_fault_tolerance_is_a_flag_with_two_values():
    assert parse_config(["--fault-tolerance", "live"]).fault_tolerance == "live"
    assert TrainConfig().fault_tolerance == "auto"  # a trainer alone restarts
    with pytest.raises(ConfigError, match="--fault-tolerance"):
        TrainConfig(fault_tolerance="elastic")


def test_the_hooks_that_run_under_live():
    assert live_comm("auto") == "none" and live_comm("bf16") == "bf16"
    assert live_comm("powersgd") == "powersgd"
    for comm in ("diloco", "localsgd"):
        with pytest.raises(ConfigError, match="--fault-tolerance restart"):
            live_comm(comm)


def test_torchfts_servers_listen_on_the_private_address_in_the_range_the_firewall_keeps_for_the_nodes():
    # The node firewall lets only the nodes reach the ephemeral range (fatpipe.node.hostfirewall.
    # guarded_ports): the Manager (its Kill RPC) and the checkpoint server (the weights) must bind there.
    from datetime import timedelta

    from torchft import manager as tf_manager
    from torchft._torchft import LighthouseServer

    from fatpipe.node.hostfirewall import guarded_ports
    from fatpipe.trainer.live.manager import _private_servers, _private_transport

    guarded = guarded_ports({"trusted": ["10.0.0.0/24"], "members": ["10.0.0.1/32"], "run_ports": [29400, 29402]})
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
    with _private_servers("127.0.0.1", 0):  # as live_manager builds them, on a loopback node's address
        server = tf_manager.ManagerServer(
            replica_id="a", lighthouse_addr=lighthouse.address(), hostname="127.0.0.1", bind="[::]:0",
            store_addr="127.0.0.1:1", world_size=1, heartbeat_interval=timedelta(milliseconds=100),
            connect_timeout=timedelta(seconds=5), quorum_retries=0)
        transport = _private_transport("127.0.0.1", timedelta(seconds=5))
    try:
        manager_host, manager_port = server.address().removeprefix("http://").rsplit(":", 1)
        checkpoint_host, checkpoint_port = transport._server.socket.getsockname()[:2]
        assert manager_host == checkpoint_host == "127.0.0.1"
        for port in (int(manager_port), checkpoint_port):
            assert any(first <= port <= last for first, last in guarded), (port, guarded)
    finally:
        transport.shutdown()
        server.shutdown()
        lighthouse.shutdown()


def test_live_across_regions_refuses_a_sync_between_them_and_names_its_flat_ring(caplog):
    """The built-in trainer under live on a node in a region (the launch refuses the plan first,
    `ops.rdzv.faultmode`; a node script run by hand meets the same line): DiLoCo between regions
    is refused, exit 2's ConfigError; a flat ring says so once, on node 0."""
    import logging

    import torch

    from fatpipe.trainer.distenv import DistEnv
    from fatpipe.trainer.livetrain import LiveTrainer

    def trainer(node_rank: str, **cfg) -> LiveTrainer:
        t = LiveTrainer.__new__(LiveTrainer)  # the checks before anything is built
        t.cfg = TrainConfig(fault_tolerance="live", **cfg)
        t.env = DistEnv(0, 0, 1, 0, torch.device("cpu"), "gloo")
        t.settings = settings_from_env({**GOOD, "FATPIPE_NODE_RANK": node_rank})
        return t

    for cfg in ({"cross_comm": "diloco"}, {"auto_periodic": True}):
        with pytest.raises(ConfigError) as e:
            trainer("0", **cfg)._flat_across_regions("r1")
        assert 'fault_tolerance = "live"' in str(e.value) and "\n" not in str(e.value)
    caplog.set_level(logging.INFO)
    trainer("1")._flat_across_regions("r1")
    trainer("0", cross_comm="flat")._flat_across_regions("r1")
    trainer("0")._flat_across_regions("")
    assert "one ring over every rank" not in caplog.text
    trainer("0")._flat_across_regions("r1")
    assert caplog.text.count("one ring over every rank") == 1


def test_the_lighthouse_serves_without_importing_torch():
    """Its server comes from torchft's compiled module alone: a node's Lighthouse (started again on
    every return) pays no torch import."""
    code = ("import sys; from fatpipe.trainer.live.lighthouse import torchft_native; "
            "server = torchft_native().LighthouseServer(bind='127.0.0.1:0', min_replicas=1); "
            "print(server.address().rsplit(':', 1)[1].isdigit(), 'torch' in sys.modules); server.shutdown()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "False"], done.stdout + done.stderr
