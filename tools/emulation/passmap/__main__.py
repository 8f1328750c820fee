"""``python -m emulation.passmap``: the pass map's command (``cli.main``)."""

import sys

from emulation.passmap.cli import main

sys.exit(main(sys.argv[1:]))
