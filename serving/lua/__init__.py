"""Lua shared by every Redis script: ``decimal.lua`` (exact comparison of tokens)."""
