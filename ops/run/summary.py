"""A run's summary: the numbers `fatpipe up` and `fatpipe status` show, read from its run folder."""

from __future__ import annotations

import json
from pathlib import Path

from fatpipe.infra.defaults import NETCHECK_FILE, SUMMARY_FILE
from fatpipe.trainer.metrics import percentile


def read_json(path: Path) -> dict:
    """A JSON object from `path`, or {} when it is missing or unreadable (a run cut short)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def run_summary(run_dir: Path, tier_gbps: float) -> dict:
    """What the run achieved, from its summary.json (the trainer's) and netcheck.json."""
    train, net = read_json(run_dir / SUMMARY_FILE), read_json(run_dir / NETCHECK_FILE)
    if train.get("steps") is None:  # a run that ended before its summary: what it recorded
        train = {**recorded_summary(run_dir), **{k: v for k, v in train.items() if v is not None}}
    return {
        "tier_gbps": tier_gbps,
        "final_loss": train.get("final_loss"),
        "eval_loss": train.get("eval_loss"),  # on the held-out windows
        "steps": train.get("steps"),
        "tokens_per_s": train.get("tokens_per_s"),
        "step_s_p50": train.get("step_s_p50"),
        "step_s_p95": train.get("step_s_p95"),
        "sync_s_p50": train.get("sync_s_p50"),
        "sync_s_p95": train.get("sync_s_p95"),
        "train_busbw_gbps": train.get("busbw_gbps"),
        "netcheck_busbw_gbps": net.get("busbw_gbps"),
        "netcheck_passed": net.get("gate", {}).get("passed") if net else None,
        "comm": train.get("comm"),
        "world_size": train.get("world_size"),
        "restarts": train.get("restarts"),
        "failed_collectives": train.get("failed_collectives"),
        "collectives_attempted": train.get("collectives_attempted"),
        "sync_failure_rate": train.get("sync_failure_rate"),
        **live_figures(train),
        # Across regions: int8 chunks the outer step skipped everywhere, a value not finite.
        "nonfinite_chunks_dropped": (train.get("regions") or {}).get("nonfinite_chunks_dropped"),
        "recorded_only": bool(train.get("recorded_only")),
    }


def live_figures(train: dict) -> dict:
    """Under live fault tolerance each node is a torchrun world of its own: the cluster's nodes
    (one replica group each), the leaves and joins of the quorum, and the exchanges across the
    groups that failed (a step that did not commit), from the run's record (ops.run.headline)."""
    if train.get("fault_tolerance") != "live":
        return {"live": False}
    changes = [m.get("event") for m in train.get("membership") or [] if isinstance(m, dict)]
    return {"live": True, "nodes": train.get("nodes"), "leaves": changes.count("leave"),
            "joins": changes.count("join"), "sync_exchanges": train.get("sync_exchanges"),
            "failed_exchanges": train.get("failed_exchanges")}


def size_row(doc: dict) -> tuple[str, str]:
    """The summary's row for the run's size: its world and restarts, or under live (each node a
    world of its own, started again by its wrapper) its replica groups, leaves and joins."""
    if doc.get("live"):
        return ("replica groups / leaves / joins",
                f"{doc.get('nodes') or '-'} / {doc.get('leaves', 0)} / {doc.get('joins', 0)}")
    restarts = doc.get("restarts")
    return ("world size / restarts",
            f"{doc.get('world_size') or '-'} / {restarts if restarts is not None else '-'}")


def failure_text(doc: dict) -> str:
    """The sync failure rate: under live the exchanges across the replica groups that failed
    (a step attempt that did not commit), else the collectives; "-" for a run from before."""
    if doc.get("sync_failure_rate") is None:
        return "-"
    rate = f"{100 * doc['sync_failure_rate']:.2f}%"
    if doc.get("live") and doc.get("sync_exchanges") is not None:
        return (f"{rate} ({doc['failed_exchanges']} of {doc['sync_exchanges']:,} exchanges across "
                "the replica groups failed)")
    return f"{rate} ({doc['failed_collectives']} of {doc['collectives_attempted']:,} collectives failed)"


def recorded_summary(run_dir: Path) -> dict:
    """The summary's figures over the steps metrics.jsonl recorded ({} for none): a run that
    failed, or was stopped, before the trainer wrote summary.json still ran those steps."""
    records = []
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line torn by the kill
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            records.append(rec)
    if not records:
        return {}

    def pct(key: str, q: float, rows: list[dict] = records) -> float | None:
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return percentile(values, q) if values else None

    synced = [r for r in records if (r.get("wire_bytes") or 0) > 0] or records
    return {"steps": len(records), "last_step": records[-1]["step"], "final_loss": records[-1].get("loss"),
            "tokens_per_s": pct("tokens_per_s", 50), "step_s_p50": pct("step_s", 50),
            "step_s_p95": pct("step_s", 95), "sync_s_p50": pct("sync_s", 50, synced),
            "sync_s_p95": pct("sync_s", 95, synced), "busbw_gbps": pct("busbw_gbps", 50, synced),
            "comm": records[-1].get("comm"), "recorded_only": True}


def no_steps_hint(script: list[str], ok: bool, doc: dict) -> str | None:
    """What to say instead of an empty summary when a run recorded no steps."""
    if doc.get("steps"):
        return None
    if not ok:
        return "no steps recorded before the run failed (the launch line says why)"
    if not script:
        return None
    return (f"{script[0]} recorded no steps for fatpipe: three lines give it comm=auto, per-node "
            "metrics, top and the report (docs/own-script.md)")
