"""Tasks deferred by name: a registry that is also a worker's handler.

Like procrastinate's ``@app.task`` or Celery's ``@app.task``, without pickling code:
a job's payload names the task and carries its keyword arguments as JSON, and the
worker looks the name up in the same registry::

    # myapp/tasks.py
    tasks = Tasks(queue="emails")

    @tasks.task
    def send_email(job: Job, *, to: str) -> None:
        guard.put(job, f"sent/{to}", b"1")          # fenced by the job's token

    send_email.defer(queue_client, to="ada@example.com")   # from anywhere

    # then, from the shell:  fencing queue worker myapp.tasks:tasks --queue emails

The payload is ``{"task": NAME, "kwargs": {...}}`` (``NAME`` the function's name unless
``@tasks.task(name=...)`` says otherwise). A job naming no task of the registry, or
whose payload is not such an object, fails for good (:class:`Discard`): no attempt
of this worker could ever run it. Otherwise the task runs as any handler does:
returning completes the job, raising fails it (``Retry``/``Discard`` as usual).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from fencing.client._queue import EnqueuedJob, Job
from fencing.client.queue import QueueClient
from fencing.errors import InvalidArgumentError
from fencing.worker._core import Discard

R = TypeVar("R")


def payload_of(name: str, kwargs: dict[str, Any]) -> bytes:
    """The job payload that defers task ``name`` with ``kwargs`` (JSON-serialisable)."""
    try:
        return json.dumps({"task": name, "kwargs": kwargs}, separators=(",", ":")).encode()
    except TypeError as exc:
        raise InvalidArgumentError(
            f"task {name!r}: its arguments must be JSON: {exc}", field="kwargs"
        ) from None


class Task(Generic[R]):
    """A registered function: call it as before, or :meth:`defer` it to the queue."""

    def __init__(self, fn: Callable[..., R], name: str, queue: str) -> None:
        self.fn = fn
        self.name = name
        self.queue = queue
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)

    def __call__(self, job: Job, **kwargs: Any) -> R:
        return self.fn(job, **kwargs)

    def defer(self, client: QueueClient, *, queue: str | None = None, **kwargs: Any) -> EnqueuedJob:
        """Enqueue one run of this task with ``kwargs`` on its queue (or ``queue``)."""
        return client.enqueue(queue or self.queue, payload_of(self.name, kwargs))

    def __repr__(self) -> str:
        return f"<Task {self.name!r} on {self.queue!r}>"


class Tasks:
    """A registry of tasks, and the handler that runs a job by the task it names
    (pass it to :class:`~fencing.worker.Worker`, or name it to ``fencing queue worker``)."""

    def __init__(self, queue: str = "default") -> None:
        self.queue = queue
        self.registered: dict[str, Task[Any]] = {}

    @overload
    def task(self, fn: Callable[..., R], /) -> Task[R]: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, queue: str | None = None
    ) -> Callable[[Callable[..., R]], Task[R]]: ...

    def task(
        self,
        fn: Callable[..., R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
    ) -> Task[R] | Callable[[Callable[..., R]], Task[R]]:
        """Register ``fn(job, **kwargs)`` under ``name`` (default its ``__name__``)."""

        def register(f: Callable[..., R]) -> Task[R]:
            task = Task(f, name or f.__name__, queue or self.queue)
            if task.name in self.registered:
                raise InvalidArgumentError(f"task {task.name!r} is registered twice", field="name")
            self.registered[task.name] = task
            return task

        return register(fn) if fn is not None else register

    def __call__(self, job: Job) -> object:
        """Run the task ``job``'s payload names (the worker's handler)."""
        try:
            body = json.loads(job.payload)
            name, kwargs = body["task"], body.get("kwargs", {})
            if not isinstance(name, str) or not isinstance(kwargs, dict):
                raise TypeError("task must be a string and kwargs an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise Discard(f"payload is not a deferred task: {exc}") from None
        task = self.registered.get(name)
        if task is None:
            raise Discard(f"no task named {name!r} here (known: {sorted(self.registered)})")
        return task(job, **kwargs)
