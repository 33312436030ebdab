"""``python -m zqsync`` runs the ``zqsync`` command."""

import sys

from .cli import main

sys.exit(main())
