"""How hard the property tests search: full example counts in the full run, a fifth in the
quick loop.

The full run (``python -m pytest -m ""``, what CI runs) or ``FENCING_TEST_THOROUGH=1``
gives every property test the count written at its ``@settings``; the default loop
(which leaves out e2e and chaos) runs a fifth of it, at least 10 examples, so the
loop stays fast while CI still searches as hard as the test asks.
"""

from __future__ import annotations

import os

#: Set by tests/conftest.py from the run's mark expression, before any test module loads.
full = os.environ.get("FENCING_TEST_THOROUGH") == "1"


def examples(count: int) -> int:
    """``count`` in a thorough run, else a fifth of it (never fewer than 10)."""
    return count if full else max(10, count // 5)
