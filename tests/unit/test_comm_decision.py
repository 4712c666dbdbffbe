"""The comm decision as one typed record: written once as a plain dict (checkpoint, summary.json),
read back from every layout fatpipe has written, and refused in one line when it cannot be read.

The older payloads below are what the trainer of each period put in a checkpoint's
`comm_decision` (its CommDecision.to_dict(), then the keys the re-decision added to that dict),
with figures of the kind a tiny run on a shaped link gives.
"""

from __future__ import annotations

import copy
import json
from dataclasses import FrozenInstanceError, replace
from types import SimpleNamespace

import pytest
import torch

from fatpipe.trainer.checkpoint import load_checkpoint, save_checkpoint
from fatpipe.trainer.comm.commsetup import decide_comm
from fatpipe.trainer.comm.costmodel import GradTraffic, HookCost, choose_comm
from fatpipe.trainer.comm.decision import (
    SCHEMA,
    CommDecision,
    DecisionUnreadable,
    LinkEstimate,
    Switch,
    SwitchRefused,
    decision_payload,
    read_decision,
)
from fatpipe.trainer.comm.redecide import WARM_STEPS, WINDOW, AutoComm
from fatpipe.trainer.config import ConfigError, TrainConfig

pytestmark = pytest.mark.timeout(60)

# The first trainer (Nov 29 - 30): predictions held wire bytes, comm, exposed comm and share only.
FIRST_AUTO = {
    "comm": "bf16",
    "reason": "least lossy hook with predicted exposed comm 14% <= 20% of the step",
    "link": {"busbw_gbps": 0.4, "latency_s": 0.0004, "source": "netcheck.json"},
    "compute_s": 0.12, "grad_bytes": 3_675_136, "buckets": 1, "world_size": 2,
    "predicted": {
        "none": {"wire_bytes": 3_675_136, "comm_s": 0.0739, "exposed_s": 0.0739, "share": 0.381},
        "bf16": {"wire_bytes": 1_837_568, "comm_s": 0.0371, "exposed_s": 0.0195, "share": 0.14},
        "fp16": {"wire_bytes": 1_837_568, "comm_s": 0.0371, "exposed_s": 0.0195, "share": 0.14},
        "powersgd": {"wire_bytes": 401_408, "comm_s": 0.0093, "exposed_s": 0.0093,
                     "share": 0.0719},
    },
}
FIRST_NAMED = {"comm": "fp16", "reason": "set by --comm", "link": None, "compute_s": 0.0,
               "grad_bytes": 0, "buckets": 1, "world_size": 2, "predicted": {}}
FIRST_SINGLE = {"comm": "none", "reason": "single process, nothing to send", "link": None,
                "compute_s": 0.0, "grad_bytes": 0, "buckets": 1, "world_size": 1,
                "predicted": {}}

_PREDICTED = {
    "none": {"wire_bytes": 3_675_136, "compute_s": 0.12, "hook_s": 0.0, "comm_s": 0.0739,
             "exposed_s": 0.0739, "step_s": 0.1939, "share": 0.381, "run_step_s": 0.1939},
    "bf16": {"wire_bytes": 1_837_568, "compute_s": 0.12, "hook_s": 0.004, "comm_s": 0.0371,
             "exposed_s": 0.0195, "step_s": 0.1435, "share": 0.164, "run_step_s": 0.1435},
    "powersgd": {"wire_bytes": 401_408, "compute_s": 0.12, "hook_s": 0.021, "comm_s": 0.0093,
                 "exposed_s": 0.0093, "step_s": 0.1503, "share": 0.2016,
                 "run_step_s": 0.1611},
    "diloco": {"wire_bytes": 73_502, "compute_s": 0.12, "hook_s": 0.0, "comm_s": 0.0015,
               "exposed_s": 0.0015, "step_s": 0.1215, "run_step_s": 0.1215, "share": 0.0121,
               "sync_every": 50, "sync_every_needed": 2, "sync_s": 0.0739, "usable": False},
}
# The re-decision (Nov 30): the link's half_rate, since_step, switches (no probe_s yet), reprobes.
REDECIDED = {
    "comm": "bf16", "reason": "least lossy hook with predicted hook + exposed comm 16% <= 20% "
                              "of the step",
    "link": {"busbw_gbps": 0.4, "latency_s": 0.0004, "source": "netcheck.json",
             "half_rate": {"bf16": 0.91, "fp16": 0.88}},
    "compute_s": 0.12, "grad_bytes": 3_675_136, "buckets": 1, "world_size": 2,
    "predicted": _PREDICTED, "since_step": 20,
    "switches": [{"step": 20, "from": "none", "to": "bf16", "measured_step_s_p50": 0.412,
                  "predicted_step_s_before": 0.1939, "repredicted_run_step_s": 0.398,
                  "predicted_run_step_s": 0.231, "busbw_gbps": 0.052, "latency_s": 0.0011,
                  "pause_s": 2.84}],
    "reprobes": 1,
}
# Later the same night: each switch also keeps its re-probe's seconds.
WITH_PROBE_S = copy.deepcopy(REDECIDED)
WITH_PROBE_S["switches"][0] = {**REDECIDED["switches"][0], "probe_s": 1.93, "pause_s": 2.84}
# A script's run (Dec 2): a re-probe's winner its DDP could not take in place.
SCRIPT_REFUSED = {**copy.deepcopy(WITH_PROBE_S), "reprobes": 2, "switch_refused": {
    "step": 40, "to": "powersgd", "why": "PowerSGD on gloo needs one DDP bucket and this model "
                                         "has several (leave bucket_cap_mb to fatpipe's wrap())"}}

OLDER = [FIRST_AUTO, FIRST_NAMED, FIRST_SINGLE, REDECIDED, WITH_PROBE_S, SCRIPT_REFUSED]


def _env(world_size: int = 2):
    return SimpleNamespace(world_size=world_size, is_main=True, device=torch.device("cpu"))


def _resumed(payload, tmp_path, step: int = 50) -> CommDecision:
    """comm=auto's decision on a resume from a checkpoint holding `payload`, through the file."""
    save_checkpoint(tmp_path, step, {"step": step, "comm_decision": payload})
    ckpt = load_checkpoint(tmp_path / f"step-{step:08d}.pt")  # weights_only, as a resume loads
    return decide_comm(TrainConfig(comm="auto"), _env(), None, 0, ckpt)


def _keeps(old, new) -> None:
    """Every key of `old`, at every depth, is in `new` with the same value."""
    if isinstance(old, dict):
        for k, v in old.items():
            assert k in new, k
            _keeps(v, new[k])
    else:
        assert new == old


@pytest.mark.parametrize("payload", OLDER, ids=["first-auto", "first-named", "first-single",
                                                "redecided", "probe-s", "script-refused"])
def test_every_older_checkpoint_layout_resumes(payload, tmp_path):
    d = _resumed(payload, tmp_path)
    assert isinstance(d, CommDecision) and d.comm == payload["comm"]
    assert d.reason == payload["reason"] and d.world_size == payload["world_size"]
    assert len(d.switches) == len(payload.get("switches", []))
    # What a run goes on with: the prediction checked, PowerSGD's start, the re-probe bounds.
    auto = AutoComm(TrainConfig(comm="auto", steps=100, warmup_steps=3), _env(), d, 50)
    rec = auto.observe({"step": 51, "step_s": 0.3})
    assert rec.get("predicted_step_s") == ((d.chosen or {}).get("step_s"))
    # Written again (the next checkpoint, summary.json): every key and value it had, plus the
    # schema and the later fields' defaults; the first layout's predictions gain their step.
    again = decision_payload(d)
    assert again.pop("schema") == SCHEMA
    _keeps(payload, again)
    assert read_decision(again) == d
    if "switches" in payload:  # the layouts since the re-decision: written back as they were
        assert again == payload


def test_the_first_layouts_predictions_get_the_step_their_model_meant():
    d = read_decision(FIRST_AUTO)
    bf16 = d.chosen
    # That model's step: compute + exposed comm (its share was exposed / that step), no hook cost.
    assert bf16["step_s"] == pytest.approx(0.12 + 0.0195) == bf16["run_step_s"]
    assert bf16["hook_s"] == 0.0 and bf16["compute_s"] == 0.12
    assert bf16["share"] == 0.14 and bf16["wire_bytes"] == 1_837_568  # as written


def test_the_older_fields_are_typed_records():
    d = read_decision(SCRIPT_REFUSED)
    assert d.link == LinkEstimate(0.4, 0.0004, "netcheck.json", {"bf16": 0.91, "fp16": 0.88})
    (s,) = d.switches
    assert s == Switch(20, "none", "bf16", 0.412, 0.1939, 0.398, 0.231, 0.052, 0.0011, 1.93, 2.84)
    assert d.switch_refused == SwitchRefused(40, "powersgd", SCRIPT_REFUSED["switch_refused"]["why"])
    assert read_decision(REDECIDED).switches[0].probe_s is None  # written before it was kept
    assert "probe_s" not in decision_payload(read_decision(REDECIDED))["switches"][0]


def test_a_checkpoint_written_now_reads_back_as_the_same_record(tmp_path):
    traffic = GradTraffic(3_675_136, buckets=1, powersgd_bytes=401_408, powersgd_buckets=1)
    made = choose_comm(LinkEstimate(0.05, 1e-3, "probe", {"bf16": 0.9}), 0.12, 1, traffic, 2,
                       cost=HookCost({"bf16": 0.004}, {"powersgd": 3}, 100))
    switch = Switch(20, "none", made.comm, 0.41, 0.19, 0.4, 0.23, 0.05, 1e-3, 1.9, 2.8)
    made = replace(made, since_step=20, switches=(switch,), reprobes=1)
    assert _resumed(decision_payload(made), tmp_path) == made
    # summary.json: JSON of plain values, the keys users and the report read (and the schema).
    text = json.loads(json.dumps(decision_payload(made)))
    assert set(text) == {"comm", "reason", "link", "compute_s", "grad_bytes", "buckets",
                         "world_size", "predicted", "since_step", "switches", "reprobes", "schema"}
    assert text["switches"][0]["from"] == "none" and text["link"]["half_rate"] == {"bf16": 0.9}
    assert read_decision(text) == made


def test_a_record_is_never_grown_in_place():
    d = read_decision(WITH_PROBE_S)
    with pytest.raises(FrozenInstanceError):
        d.comm = "none"
    with pytest.raises(FrozenInstanceError):
        d.switch_refused = SwitchRefused(1, "fp16", "x")


@pytest.mark.parametrize("payload, says", [
    (["bf16"], "a comm decision is a dict, not list"),
    ({**WITH_PROBE_S, "comm": "zstd"}, "comm 'zstd' is none of"),
    ({**WITH_PROBE_S, "reason": None}, "'reason' is None, not text"),
    ({k: v for k, v in WITH_PROBE_S.items() if k != "comm"}, "no 'comm'"),
    ({**WITH_PROBE_S, "since_step": "20"}, "'since_step' is '20', not a whole number"),
    ({**WITH_PROBE_S, "link": {"latency_s": 1e-3, "source": "probe"}}, "link: no 'busbw_gbps'"),
    ({**WITH_PROBE_S, "switches": [{"step": 20}]}, "switch: no 'from'"),
    ({**WITH_PROBE_S, "predicted": {"bf16": {"step_s": "fast"}}}, "'step_s' is 'fast'"),
    ({**WITH_PROBE_S, "link": {**WITH_PROBE_S["link"], "half_rate": {"bf16": "x"}}},
     "half_rate: 'bf16' is 'x', not a number"),
    ({**WITH_PROBE_S, "switch_refused": {"step": 40, "to": "powersgd"}}, "no 'why'"),
    ({**WITH_PROBE_S, "switches": "none"}, "'switches' is 'none', not a list"),
    ({**WITH_PROBE_S, "schema": SCHEMA + 1}, f"schema {SCHEMA + 1}: this fatpipe reads"),
    ({**WITH_PROBE_S, "schema": "1"}, "schema '1': this fatpipe reads"),
])
def test_an_unreadable_decision_is_refused_in_one_line_naming_it(payload, says, tmp_path):
    with pytest.raises(DecisionUnreadable) as refused:
        _resumed(payload, tmp_path)
    message = str(refused.value)
    assert says in message and "\n" not in message
    assert message.startswith("cannot resume step 50 with comm=auto: ")
    assert "--comm" in message and isinstance(refused.value, ConfigError)  # exit 2, one line


def test_a_checkpoint_without_a_decision_decides_anew_and_a_named_comm_reads_none(tmp_path):
    ckpt = {"step": 50, "comm_decision": None}
    fresh = decide_comm(TrainConfig(comm="auto"), _env(world_size=1), None, 0, ckpt)
    assert fresh == CommDecision("none", "single process, nothing to send")
    # A named --comm never reads the checkpoint's: a garbled one is no obstacle to it.
    named = decide_comm(TrainConfig(comm="bf16"), _env(), None, 0, {"comm_decision": ["?"]})
    assert named == CommDecision("bf16", "set by --comm", world_size=2)


def test_an_older_decision_goes_on_checking_its_prediction():
    auto = AutoComm(TrainConfig(comm="auto", steps=100, warmup_steps=3), _env(),
                    read_decision(FIRST_AUTO), 0)
    recs = [auto.observe({"step": s, "step_s": 0.2}) for s in range(1, WARM_STEPS + WINDOW + 1)]
    assert recs[-1]["prediction_error"] == pytest.approx(0.2 / (0.12 + 0.0195) - 1)
