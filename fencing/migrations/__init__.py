"""The PostgreSQL schema of the lease server and the guard, as versioned SQL files.

``NNNN_name.sql`` files are applied in order by :func:`fencing.pg.migrate`, each
once, inside one transaction, and recorded in ``<schema>.schema_migrations``.
A file runs with ``search_path = <schema>, pg_temp``, so it names its tables
unqualified; every function it creates has ``SET search_path FROM CURRENT`` and so
finds its tables from any session, whatever that session's search_path.
Never edit a file that has shipped: add the next number.
"""
