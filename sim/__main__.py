"""``python -m sim``: see ``sim.outputs.cli``."""

import sys

from sim.outputs.cli import main

sys.exit(main())
