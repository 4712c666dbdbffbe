"""bench/seed_table.py's figures: the per-configuration numbers, the ratios and the plot (the eval
loss of each final model is its run's summary's, on the held-out windows)."""

from __future__ import annotations

import statistics


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def figures(r: dict, scale: float, warmup: int) -> dict:
    """One configuration's row, from its per-step records."""
    recs = r["records"]
    after = [x for x in recs if x["step"] > warmup]  # PowerSGD sends plain gradients until then
    n = len(recs)
    epoch = sum(x["step_s"] for x in recs)
    tokens_per_step = recs[0]["tokens_per_s"] * recs[0]["step_s"]
    synced = [x for x in recs if x["wire_bytes"]]
    exposed = sum(x["exposed_comm_s"] for x in recs)
    busbw = _pct([x["busbw_gbps"] for x in synced], 50)

    def loss_at(step: int) -> float:  # mean of the 5 steps up to `step`: one batch is noisy
        window = [x["loss"] for x in recs if step - 5 < x["step"] <= step]
        return statistics.fmean(window)

    marks = sorted({max(5, n // 4), max(5, n // 2), max(5, 3 * n // 4), n})
    return {
        "steps": n, "tokens_per_step": round(tokens_per_step), "epoch_s": epoch,
        "step_s_p50": _pct([x["step_s"] for x in recs], 50),
        "step_s_p95": _pct([x["step_s"] for x in recs], 95),
        "tokens_per_s": tokens_per_step * n / epoch,
        "tokens_per_s_after_warmup": tokens_per_step * len(after)
        / max(sum(x["step_s"] for x in after), 1e-9),
        "sync_s_p50": _pct([x["sync_s"] for x in synced], 50),
        "sync_s_p95": _pct([x["sync_s"] for x in synced], 95),
        "syncs": len(synced),
        "exposed_share": exposed / epoch,
        "compute_s_mean": (epoch - exposed) / n, "exposed_s_mean": exposed / n,
        "wire_bytes_per_step": sum(x["wire_bytes"] for x in recs) / n,
        "busbw_gbps_sim": busbw, "busbw_gbps_at_target_scale": busbw / scale,
        "train_loss_at": {str(s): loss_at(s) for s in marks},
        "final_train_loss": recs[-1]["loss"], "eval_loss": r["eval_loss"],
    }


def report(results: list[dict], a: dict) -> dict:
    """Print the table and the ratios; add each row's figures to its result; the ratios."""
    for r in results:
        r["figures"] = figures(r, a["scale"], a["warmup_steps"])
    base = results[0]["figures"]  # 10g none
    print(f"\n{'config':22s} {'link':>10s} {'step p50/p95 ms':>16s} {'tokens/s':>9s} {'x10g':>5s} "
          f"{'sync p50/p95 ms':>16s} {'exposed':>7s} {'MB/step':>8s} {'busbw':>15s} "
          f"{'train loss':>10s} {'eval loss':>9s} {'vs10g':>6s}")
    for r in results:
        f = r["figures"]
        print(f"{r['label']:22s} {r['rate_gbps'] * 1e3:6.1f} Mb/s "
              f"{f['step_s_p50'] * 1e3:7.0f}/{f['step_s_p95'] * 1e3:<7.0f} "
              f"{f['tokens_per_s']:9,.0f} {f['tokens_per_s'] / base['tokens_per_s']:5.2f} "
              f"{f['sync_s_p50'] * 1e3:7.0f}/{f['sync_s_p95'] * 1e3:<7.0f} "
              f"{f['exposed_share']:7.0%} {f['wire_bytes_per_step'] / 1e6:8.3f} "
              f"{f['busbw_gbps_sim'] * 1e3:5.1f} Mb/s={f['busbw_gbps_at_target_scale']:5.2f}G "
              f"{f['final_train_loss']:10.3f} {f['eval_loss']:9.3f} "
              f"{f['eval_loss'] / base['eval_loss'] - 1:+6.1%}")
    one_g, auto = results[1]["figures"], results[2]["figures"]
    ratios = {
        "epoch_time_10g_over_1g": base["epoch_s"] / one_g["epoch_s"],
        "seed_claim_epoch_time_10g_over_1g": 0.65,
        "tokens_per_s_1g_auto_over_10g_none": auto["tokens_per_s"] / base["tokens_per_s"],
        "goal_tokens_per_s_ratio": 0.90,
        "tokens_per_s_after_warmup_1g_auto_over_10g_none": auto["tokens_per_s_after_warmup"]
        / base["tokens_per_s_after_warmup"],
        "eval_loss_1g_auto_over_10g_none": auto["eval_loss"] / base["eval_loss"],
        "final_train_loss_1g_auto_over_10g_none": auto["final_train_loss"]
        / base["final_train_loss"],
        "goal_loss_within": 0.05,
        "exposed_share_10g_none": base["exposed_share"], "goal_exposed_share_10g_none": 0.10,
        "auto_chose": results[2]["comm"],
        "auto_sync_every": ((results[2].get("decision") or {}).get("predicted") or {})
        .get(results[2]["comm"], {}).get("sync_every"),
    }
    print(f"\n10g/1g epoch time (plain DDP): {ratios['epoch_time_10g_over_1g']:.3f} "
          f"(seed: ~0.65, a 35% cut)")
    print(f"1g auto ({ratios['auto_chose']}, H={ratios['auto_sync_every']}) tokens/s over 10g "
          f"none: {ratios['tokens_per_s_1g_auto_over_10g_none']:.2f} (goal >= 0.90); after the "
          f"{a['warmup_steps']} LR warm-up steps: "
          f"{ratios['tokens_per_s_after_warmup_1g_auto_over_10g_none']:.2f}")
    print(f"1g auto final model's eval loss over 10g none's: "
          f"{ratios['eval_loss_1g_auto_over_10g_none']:.3f} (goal within 5%); last-step train "
          f"loss {ratios['final_train_loss_1g_auto_over_10g_none']:.3f}")
    print(f"exposed communication at 10g none: {ratios['exposed_share_10g_none']:.0%} "
          f"(goal <= 10%)")
    return ratios


def plot(results: list[dict], a: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(13, 5))
    labels = [r["label"] for r in results]
    compute = [r["figures"]["compute_s_mean"] * 1e3 for r in results]
    exposed = [r["figures"]["exposed_s_mean"] * 1e3 for r in results]
    bars.bar(labels, compute, label="compute (and hidden comm)", color="#4c72b0")
    bars.bar(labels, exposed, bottom=compute, label="exposed comm", color="#dd8452")
    bars.set_ylabel("ms per step (sim time)")
    bars.set_title(f"mean step, links x{a['scale']:.4f} ({a['name']})", fontsize=9)
    bars.tick_params(axis="x", labelrotation=20, labelsize=8)
    bars.legend(fontsize=8)
    for r in results:
        recs = r["records"]
        tokens = [x["step"] * r["figures"]["tokens_per_step"] for x in recs]
        smooth = [statistics.fmean(y["loss"] for y in recs[max(0, i - 4):i + 1])
                  for i in range(len(recs))]
        curves.plot(tokens, smooth, label=f"{r['label']} (eval {r['eval_loss']:.3f})")
    curves.set_xlabel("tokens (all ranks)")
    curves.set_ylabel("training loss, rank 0 (5-step mean)")
    curves.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
