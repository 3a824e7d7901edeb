"""``python -m fencing`` is the ``fencing`` command."""

import sys

from fencing.cli import main

sys.exit(main())
