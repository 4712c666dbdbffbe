"""The CDKTF app entry (cdktf.json `app`): `cdktf synth` and `cdktf deploy` run this."""

import os
import sys

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.project import load_project

from .app import build_app


def main() -> int:
    try:
        project = load_project()
        # cdktf passes its output folder in the environment; honour it so `cdktf synth -o` works.
        outdir = os.environ.get("CDKTF_OUTDIR")
        build_app(project, outdir=outdir).synth()
    except FatpipeError as e:
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


sys.exit(main())
