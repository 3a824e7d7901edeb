"""One conformance suite for every SDK: scenarios written once as data, a driver per SDK.

``python -m conformance`` starts real servers, runs every scenario on every driver (each
also as its control, with the rule broken, which must show the violation) and prints a
Markdown table. See :mod:`conformance.__main__`.
"""
