"""The CDK app entry (cdktf.json `app`): `cdktf synth`/`cdktn synth` and their `deploy` run this."""

from __future__ import annotations

import os
import sys

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.project import load_project

from .app import build_app


def main() -> int:
    try:
        project = load_project()
        # Both CLIs pass their output folder as CDKTF_OUTDIR (cdktn kept the name): honour it so
        # `cdktf synth -o` works. The core is FATPIPE_TOOLKIT's, whichever CLI started this.
        outdir = os.environ.get("CDKTF_OUTDIR")
        build_app(project, outdir=outdir).synth()
    except FatpipeError as e:
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


sys.exit(main())
