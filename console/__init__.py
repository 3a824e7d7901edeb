"""``fencing console``: a web page over the public gRPC APIs of the lease server, the
guards and the queues, for operators.

It keeps no state of its own beyond its logged-in sessions: every page is a thin view
over the calls the CLI makes (``List``, ``Describe``, ``Watch``, ``DescribeFence``,
``ListRefusals``, ``Stats``, ``ListJobs``, ``GetJob``, ``ListSchedules``), through the
asyncio SDK clients with the CLI's TLS and credential settings. One ``Watch`` stream
per process (:mod:`console.feed`) drives every open tab's live parts over server-sent
events. Actions on jobs are off unless allowed, and then need a logged-in operator,
a confirmation and a CSRF token (:mod:`console.operators`). See docs/console.md.

Modules: ``command`` (options, ``fencing console``), ``upstream`` (the clients and
which server is unreachable), ``feed`` (the shared Watch), ``operators`` (login,
sessions, CSRF), ``app`` (the Starlette routes), ``templates/`` and ``static/``
(htmx and its SSE extension, vendored with their licenses).
"""
