"""The lanes of `make test` are dealt by a rule from measured seconds (tests/lanes.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import lanes
import pytest

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.system.test_a" name="test_one" time="10.5" />
<testcase classname="tests.system.test_a" name="test_two[x]" time="2.0" />
<testcase classname="tests.system.test_b.TestGroup" name="test_three" time="4.0" />
<testcase classname="tests.unit.test_c" name="test_four" time="0.5" />
</testsuite></testsuites>"""

DURATIONS = """============================= slowest durations =============================
152.43s call     tests/system/test_a.py::test_one
> 3.00s setup    tests/system/test_a.py::test_two[x y]
0.50s teardown tests/unit/test_c.py::test_four
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


@pytest.fixture
def tree(tmp_path):
    for name in ("tests/system/test_a.py", "tests/system/test_b.py", "tests/unit/test_c.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    return tmp_path


def test_the_longest_go_first_onto_the_lighter_lane():
    costs = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 20.0, "e": 10.0}
    one, two = lanes.split(costs, list(costs))
    assert (one, two) == (["a", "d"], ["b", "c", "e"])  # 120 s beside 120 s


def test_a_module_the_file_lacks_counts_the_default():
    one, two = lanes.split({"a": 50.0, "b": 40.0}, ["a", "b", "new"])
    assert one == ["new"] and two == ["a", "b"]  # new counts 60 s: it goes first


def test_every_module_runs_in_exactly_one_lane_and_the_lanes_are_even():
    costs, names = lanes.load(), lanes.items()
    dealt = lanes.split(costs, names)
    assert sorted(dealt[0] + dealt[1]) == sorted(names) and lanes.UNIT in names
    loads = sorted(sum(costs.get(n, lanes.DEFAULT_S) for n in lane) for lane in dealt)
    assert loads[1] - loads[0] <= max(costs.get(n, lanes.DEFAULT_S) for n in names)


def test_the_durations_name_only_modules_that_exist():
    assert set(lanes.load()) <= set(lanes.items())


def test_junit_and_durations_output_give_seconds_per_module(tree):
    assert lanes.measured(JUNIT, tree) == {"tests/system/test_a.py": 12.5, "tests/system/test_b.py": 4.0,
                                           "tests/unit": 0.5}
    assert lanes.measured(DURATIONS, tree) == {"tests/system/test_a.py": 155.43, "tests/unit": 0.5}


def test_an_update_replaces_the_measured_modules_and_keeps_the_others(tmp_path):
    durations, run = tmp_path / "durations.json", tmp_path / "run.xml"
    durations.write_text(json.dumps({"tests/system/test_vm.py": 500.0, "tests/unit": 100.0}))
    run.write_text(JUNIT.replace("tests.system.test_a", "tests.system.test_vm").replace("unit.test_c", "unit.gone"))
    lanes.update([str(run)], durations)
    assert json.loads(durations.read_text()) == {"tests/system/test_vm.py": 12.5, "tests/unit": 100.0}


def test_an_output_without_durations_changes_nothing_and_says_so(tmp_path):
    durations, run = tmp_path / "durations.json", tmp_path / "run.txt"
    durations.write_text('{"tests/unit": 100.0}')
    run.write_text("collected 0 items\n")
    with pytest.raises(SystemExit, match="no test durations in"):
        lanes.update([str(run)], durations)
    assert durations.read_text() == '{"tests/unit": 100.0}'


def test_the_makefile_gets_each_lane_from_the_command_line():
    run = [sys.executable, str(lanes.Path(lanes.__file__))]
    one, two = (subprocess.run([*run, n], capture_output=True, text=True, check=True).stdout.split()
                for n in ("1", "2"))
    assert sorted(one + two) == sorted(lanes.items())
    bad = subprocess.run([*run, "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
