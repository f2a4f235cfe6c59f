"""``python -m quantune`` runs the CLI."""

from __future__ import annotations

import sys

from quantune.cli import main

sys.exit(main())
