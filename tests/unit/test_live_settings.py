"""What a live run reads from its node's environment, and the Lighthouse's bind address: a bad
value is one line naming it; nothing becomes a bind address that is not an IP address."""

from __future__ import annotations

import pytest

from fatpipe.trainer.config import ConfigError, TrainConfig, parse_config
from fatpipe.trainer.live.lighthouse import bind_address
from fatpipe.trainer.live.lighthouse import main as lighthouse_main
from fatpipe.trainer.live.manager import host_in_url, settings_from_env
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
])
def test_a_bad_value_is_one_line_naming_it(key, value, named):
    with pytest.raises(ConfigError) as e:
        settings_from_env({**GOOD, key: value})
    assert named in str(e.value) and "\n" not in str(e.value)


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
