"""A node's check of its staged data against the operator's manifest (`data verify`, `launch`, a push).

    python -m fatpipe.trainer.staging.check check [--rehash] [--prune] MANIFEST PROJECT_FOLDER

Prints the node's verdict as its last line: `ok <fingerprint>`, else the first listed file that
differs and the files the folder holds beyond the manifest, named (`tidy`), and exits 1. With
`--rehash` every file is read again, whatever the hash cache says. With `--prune` (a push) the
extras are removed first, listed on a `PRUNED <json list>` line, and when every listed file
matches the manifest is kept beside the data, so the trainer reads what it lists. A manifest that
names a file outside the folder is refused in one line (`names`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fatpipe.trainer.staging.manifest import first_difference, node_cache, write_manifest
from fatpipe.trainer.staging.names import UnsafeName, check_manifest
from fatpipe.trainer.staging.tidy import describe_extras, extra_files, prune

PRUNED_PREFIX = "PRUNED "
USAGE = "usage: python -m fatpipe.trainer.staging.check check [--rehash] [--prune] MANIFEST PROJECT_FOLDER"


def verdict(manifest: dict, root: Path, rehash: bool = False, tidy: bool = False) -> tuple[str | None, list[str]]:
    """(the node's problem or None, what `tidy` removed)."""
    removed = prune(manifest, root) if tidy else []
    cache = node_cache(manifest, root)
    if rehash:
        cache.files.clear()
    problem = first_difference(manifest, root, cache)
    cache.save()
    extras = [] if tidy else extra_files(manifest, root)
    if extras:
        problem = "; ".join(filter(None, [problem, describe_extras(manifest, extras)]))
    if tidy and problem is None:
        write_manifest(manifest, root)
    return problem, removed


def main(argv: list[str]) -> int:
    flags = [a for a in argv[1:] if a in ("--rehash", "--prune")]
    args = [a for a in argv if a not in flags]
    if len(args) != 3 or args[0] != "check":
        print(USAGE, file=sys.stderr)
        return 2
    root = Path(args[2])
    try:
        manifest = check_manifest(json.loads(Path(args[1]).read_text()), args[1])
        problem, removed = verdict(manifest, root, "--rehash" in flags, "--prune" in flags)
    except UnsafeName as e:
        print(" ".join(str(e).split()))
        return 1
    if removed:
        print(PRUNED_PREFIX + json.dumps(removed))
    if problem:
        print(problem)
        return 1
    print(f"ok {manifest['fingerprint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
