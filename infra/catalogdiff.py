"""What a catalog refresh keeps and changes: the type filter, the price block and the changes.

Pure helpers shared by every provider's refresh (`fatpipe catalog P`): the refreshed file keeps
the offline table's prices with their source and date (a type the table lacks stays in the
catalog, marked unpriced: no price is invented), and the command prints what changed against
the catalog that was in use before.
"""

from __future__ import annotations

from .errors import ConfigError

# Fields a change is reported for, with their unit in the printed line.
_WATCHED = {"baseline_gbps": " Gbit/s", "peak_gbps": " Gbit/s", "vcpus": " vCPU",
            "memory_gib": " GiB", "gpus": " GPU", "gpu_kind": "", "cluster_placement": "", "ena": ""}
MAX_NAMED = 12  # names listed per added/removed line; the rest are counted


def family(name: str) -> str:
    """A type's family: `c7gn` of `c7gn.xlarge` (AWS), `s` of `s-2vcpu-4gb` (DigitalOcean)."""
    return name.split(".")[0] if "." in name else name.split("-")[0]


def select(names: list[str], types: tuple[str, ...] = (), families: tuple[str, ...] = ()) -> list[str]:
    """The names that `--types`/`--families` keep (all without either); a wanted one that is
    not offered is a ConfigError naming it, so a typo never yields a silently short catalog."""
    if not types and not families:
        return list(names)
    offered = set(names)
    missing = [t for t in types if t not in offered]
    if missing:
        raise ConfigError(f"--types: {', '.join(missing)} not offered there")
    have = {family(n) for n in names}
    empty = [f for f in families if f not in have]
    if empty:
        raise ConfigError(f"--families: no type of {', '.join(empty)} offered there")
    return [n for n in names if n in types or family(n) in families]


def priced(types: dict[str, dict], prices: dict) -> tuple[dict[str, dict], dict]:
    """The records with `unpriced` marked, and the price block (source, date) kept for them."""
    hourly = prices.get("hourly", {})
    kept = {k: v for k, v in prices.items() if k != "hourly"}
    kept["hourly"] = {name: hourly[name] for name in types if name in hourly}
    marked = {name: {**record, "unpriced": name not in hourly} for name, record in types.items()}
    return marked, kept


def changes(old: dict[str, dict], new: dict[str, dict]) -> list[str]:
    """One line per change between two catalogs' `types`: added, removed, each changed field."""
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    lines = []
    if added:
        lines.append(f"added {len(added)}: {_names(added)}")
    if removed:
        lines.append(f"removed {len(removed)}: {_names(removed)}")
    for name in sorted(set(old) & set(new)):
        for key, unit in _WATCHED.items():
            before, after = old[name].get(key), new[name].get(key)
            if key in old[name] and before != after:
                lines.append(f"{name}: {key} {_text(before)}{unit} -> {_text(after)}{unit}")
    return lines


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMED])
    return shown + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")


def _text(value) -> str:
    return "unknown" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
