"""Completing a claim reads no job back: the lease server remembers the resource of each
job it handed out (most name none), so ending a claim knows whether it holds a lease on
the job's resource without a lookup per job (a round trip to the database each)."""

from __future__ import annotations

from fencing import QueueClient
from fencing.testing import running_servers
from lease_server.queue.backends.memory import MemoryQueue
from lease_server.queue.jobs import JobRecord


class CountingQueue(MemoryQueue):
    """The memory backend, counting the jobs read back one by one."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    async def get(self, job_id: int) -> JobRecord | None:
        self.gets += 1
        return await super().get(job_id)


def test_ending_claims_of_jobs_without_a_resource_reads_no_job() -> None:
    backend = CountingQueue()
    with running_servers(queue=backend) as servers, QueueClient(servers.queue_address) as q:
        for i in range(6):
            q.enqueue("mail", f"{i}".encode())
        first = q.claim("mail", batch=3)
        claimed, verdicts = q.complete_and_claim(first, "mail", batch=3)
        assert verdicts == [None] * 3 and len(claimed) == 3
        q.complete(claimed)
        assert backend.gets == 0


def test_a_job_naming_its_resource_still_releases_its_lease_on_complete() -> None:
    backend = CountingQueue()
    with running_servers(queue=backend) as servers, QueueClient(servers.queue_address) as q:
        q.enqueue("mail", b"x", resource="orders/7")
        (job,) = q.claim("mail")
        q.complete(job)
        # The lease on the job's resource went with the claim: the next job gets it.
        q.enqueue("mail", b"y", resource="orders/7")
        (again,) = q.claim("mail")
        assert again.token > job.token
        assert backend.gets == 0
