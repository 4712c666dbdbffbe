"""A node's check of its staged data against the operator's manifest (`data verify`, `launch`, a push).

    python -m fatpipe.trainer.staging.check check [--rehash] [--prune [--own]] MANIFEST PROJECT_FOLDER

Prints the node's verdict as its last line: `ok <fingerprint>`, else the first listed file that
differs and the extras a push would remove, named (`tidy`), and exits 1. With `--rehash` every
file is read again, whatever the hash cache says. With `--prune` (a push) a file fatpipe did not
stage where the data goes stops it (an `IN-THE-WAY <line>` line, nothing written: `record`),
then the extras fatpipe staged are removed, listed on a `PRUNED <json list>` line, what it will
write is recorded, and when every listed file matches the manifest is kept beside the data, so
the trainer reads what it lists. `--own`: the project folder is fatpipe's (an ssh node's, claimed
in the same program), so a dataset folder it begins there is its alone. A manifest that names a
file outside the folder is refused in one line (`names`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fatpipe.trainer.staging.manifest import first_difference, node_cache, write_manifest
from fatpipe.trainer.staging.names import UnsafeName, check_manifest
from fatpipe.trainer.staging.record import InTheWay, Staged, make_room, same_bytes
from fatpipe.trainer.staging.tidy import describe_extras, removable

PRUNED_PREFIX, IN_THE_WAY_PREFIX = "PRUNED ", "IN-THE-WAY "
USAGE = "usage: python -m fatpipe.trainer.staging.check check [--rehash] [--prune [--own]] MANIFEST PROJECT_FOLDER"


def verdict(manifest: dict, root: Path, rehash: bool = False, tidy: bool = False,
            own: bool = False) -> tuple[str | None, list[str]]:
    """(the node's problem or None, what `tidy` removed); InTheWay when `tidy` meets a file
    fatpipe did not stage where the data goes. `own`: the project folder is fatpipe's."""
    cache = node_cache(manifest, root)
    if rehash:
        cache.files.clear()
    staged = Staged.begin(manifest, root, own) if tidy else Staged.read(manifest, root)
    removed = make_room(manifest, root, staged, same_bytes(cache, manifest["chunk_size"])) if tidy else []
    problem = first_difference(manifest, root, cache)
    cache.save()
    extras = [] if tidy else removable(manifest, root, staged)
    if extras:
        problem = "; ".join(filter(None, [problem, describe_extras(manifest, extras)]))
    if tidy and problem is None:
        write_manifest(manifest, root)
    return problem, removed


def main(argv: list[str]) -> int:
    flags = [a for a in argv[1:] if a in ("--rehash", "--prune", "--own")]
    args = [a for a in argv if a not in flags]
    if len(args) != 3 or args[0] != "check":
        print(USAGE, file=sys.stderr)
        return 2
    root = Path(args[2])
    try:
        manifest = check_manifest(json.loads(Path(args[1]).read_text()), args[1])
        problem, removed = verdict(manifest, root, "--rehash" in flags, "--prune" in flags, "--own" in flags)
    except UnsafeName as e:
        print(" ".join(str(e).split()))
        return 1
    except InTheWay as e:
        print(IN_THE_WAY_PREFIX + " ".join(str(e).split()))
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
