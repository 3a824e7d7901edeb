"""Runnable examples: the systems of the seed documents, each against ``fencing serve``.

Run one from the repository root, e.g. ``python -m examples.scheduling``; each prints
what it shows and exits 0 only when its claims held (README, section Examples).
"""
