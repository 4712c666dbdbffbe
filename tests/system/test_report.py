"""`fatpipe report`: the run page, loaded in a real headless browser (Debian's chromium): no console
errors, every figure drawn."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import skip_or_fail

from fatpipe.infra.outputs import parse_outputs
from fatpipe.infra.project import load_project
from fatpipe.infra.runs import new_run
from fatpipe.ops.plan.report import write_report
from fatpipe.ops.rdzv.rendezvous import new_rendezvous
from fatpipe.ops.reach.cluster import Cluster

BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]


def fake_run(project_dir: Path) -> Path:
    """A finished 3-node run: its rendezvous, metrics, summary and netcheck, as the run writes them."""
    project = load_project()
    outputs = parse_outputs({
        "name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
        "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}", "transport": "local"} for i in range(3)]})
    run_id, run_dir = new_run(project, "demo")
    new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir)
    records = [{"step": s, "loss": 5 * math.exp(-s / 20), "lr": 1e-3, "step_s": 0.5, "tokens_per_s": 2000,
                "sync_s": 0.05 + 0.01 * (s % 3), "exposed_comm_s": 0.02, "grad_bytes": 4_000_000,
                "wire_bytes": 4_000_000, "busbw_gbps": 0.8, "nic_tx_gbps": 0.6, "nic_rx_gbps": 0.6,
                "comm": "none"} for s in range(1, 41)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 41, "lo')
    (run_dir / "summary.json").write_text(json.dumps({
        "steps": 40, "final_loss": records[-1]["loss"], "tokens_per_s": 2000, "step_s_p50": 0.5,
        "world_size": 3, "comm": "none", "restarts": 1, "comm_decision": {"comm": "none", "reason": "fast link"}}))
    rows = [{"size": 1 << k, "busbw_gbps": 0.9, "algbw_gbps": 0.7} for k in range(20, 29)]
    (run_dir / "netcheck.json").write_text(json.dumps({"tier_gbps": 1, "allreduce": rows, "busbw_gbps": 0.9,
                                                       "gate": {"passed": True, "reasons": []}}))
    return run_dir


def test_report_renders_in_a_headless_browser(project_dir, run_cli, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        skip_or_fail("needs chromium (Debian package chromium)")
    run_dir = fake_run(project_dir)
    result = run_cli("report")
    assert result.exit_code == 0, result.output
    page = run_dir / "report.html"
    assert str(page) in result.output.replace("\n", "")
    assert sorted(p.name for p in run_dir.glob("report-*.png")) == [
        "report-link-use.png", "report-loss.png", "report-netcheck.png", "report-step-split.png",
        "report-sync-latency.png"]
    proc = subprocess.run([browser, *BROWSER_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'data-figures="5"' in proc.stdout and 'data-expected="5"' in proc.stdout, proc.stdout[:500]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, "\n".join(console)


def test_report_of_nothing_says_so(project_dir, tmp_path):
    with pytest.raises(Exception, match="nothing to report yet"):
        write_report(tmp_path)
