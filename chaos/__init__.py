"""The chaos harness: break the system on purpose, record what clients saw, judge it.

A run starts the lease server and the guard, puts fault proxies between the
parts, drives client processes through a workload while faults are injected,
stops the clients, reads every resource's final state, and hands the merged
history to a pure checker. Every run also has a control (the guard's fencing
turned ``off``) checked against the same rules, which must show violations:
a checker that cannot fail proves nothing.

Modules, one noun each:

- :mod:`chaos.history`: the history model (:class:`~chaos.history.Event`,
  :class:`~chaos.history.Operation`), one JSONL file per client process
  (:class:`~chaos.history.HistoryWriter`, :func:`~chaos.history.read_history`) and
  the :class:`~chaos.history.Recorder` clients use to log invoke/ok/fail/info.
- :mod:`chaos.checker`: :func:`~chaos.checker.check`, the pure verdict over a
  history (token uniqueness and order, stale writes, lost writes, duplicate
  effects, lost read-modify-write increments) plus measured statistics (overlap
  of believed ownership, takeover latency).
- :mod:`chaos.proxy`: :class:`~chaos.proxy.FaultProxy`, an asyncio TCP proxy on
  loopback that adds latency, partitions (blackhole), resets, refusals and
  half-open links, and its thread-hosted twin :class:`~chaos.proxy.ThreadedFaultProxy`.

- :mod:`chaos.processes` (a child process in its own session), :mod:`chaos.servers`
  (the lease server, the guard, throwaway PostgreSQL and Redis) and
  :mod:`chaos.cluster` (the topology of one run, started and stopped as a whole).

Process faults (SIGSTOP/SIGCONT pauses, SIGKILL crashes, restarts), workloads,
scenarios, reports and :mod:`chaos.matrix` (every scenario x backend x mode) are
built on top of these.
"""
