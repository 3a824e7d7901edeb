"""The Redis guard store's Lua scripts, one file per operation (see each file's header)."""
