"""The PostgreSQL schema of the lease server and the guard, as versioned SQL files.

``NNNN_name.sql`` files are applied in order by :func:`serving.postgres_db.migrate`, each
once, inside one transaction, and recorded in ``<schema>.schema_migrations``.
A file runs with ``search_path = <schema>, pg_temp``, so it names its tables
unqualified; every function it creates has ``SET search_path FROM CURRENT`` and so
finds its tables from any session, whatever that session's search_path.
Never edit a file that has shipped: add a new number. Numbers must be unique but
need not be contiguous (parallel work reserves numbers): every version missing in
the schema is applied, in version order, even one below a version already applied,
so a migration must not depend on one with a higher number.
"""
