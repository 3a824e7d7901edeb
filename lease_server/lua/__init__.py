"""The Redis lease backend's Lua scripts, one file per operation (see each file's header)."""
