"""Lua shared by every Redis script, the SDK's (:mod:`fencing.redis`) and the servers'
(:func:`serving.redis_db.load_lua`): ``decimal.lua`` (exact comparison of tokens);
and ``own_keys_write.lua``, :mod:`fencing.redis`'s fenced write."""
