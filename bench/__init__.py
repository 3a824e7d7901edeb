"""Benchmarks: each question a module, each printing ratios against a baseline from the same run.

The machine is noisy, so absolute figures drift between runs; a ratio against a
floor measured seconds earlier on the same machine (an empty gRPC call on the same
server stack, or the backend driven directly) is what a reader can compare.
"""
