"""The fencing lease server: leases whose every grant carries a larger fencing token."""
