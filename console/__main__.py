"""``python -m console`` is ``fencing console``."""

import sys

from console.command import main

sys.exit(main())
