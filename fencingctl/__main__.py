"""``python -m fencingctl`` is the ``fencing`` command."""

import sys

from fencingctl import main

sys.exit(main())
