"""The fencing guard: a fenced store that rejects writes carrying a stale token."""
