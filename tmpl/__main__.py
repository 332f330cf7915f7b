"""``python -m tmpl`` runs the command line (see :mod:`tmpl.cli`)."""

import sys

from .cli import main

sys.exit(main())
