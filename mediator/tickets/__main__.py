"""``python -m mediator.tickets`` runs the ``tickets`` command (used by tests and by hosts without
the console script installed)."""

from __future__ import annotations

import sys

from mediator.tickets.cli import main

sys.exit(main())
