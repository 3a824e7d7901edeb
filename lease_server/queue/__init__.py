"""The queue wing of the lease server: jobs claimed under a lease-like token."""
