"""serving/group_commit.py, the one group-commit mechanism (guard writes, queue completes,
lease calls): batches form from what queued while a step ran, limits split them, a
failed step fails exactly its own callers, and a lone item may run in its caller's task."""

from __future__ import annotations

import asyncio

import pytest

from serving.group_commit import GroupCommit


class Recorder:
    """A commit function that records each step's items and the task it ran in, and
    yields to the loop once (as a round trip does); a step carrying ``fail_on`` raises."""

    def __init__(self) -> None:
        self.steps: list[list[int]] = []
        self.tasks: list[asyncio.Task[object] | None] = []
        self.fail_on: int | None = None

    async def __call__(self, items: list[int]) -> list[int]:
        self.tasks.append(asyncio.current_task())
        await asyncio.sleep(0)
        self.steps.append(items)
        if self.fail_on in items:
            raise RuntimeError("step failed")
        return [i * 10 for i in items]


async def test_what_queues_while_a_step_runs_goes_as_the_next_step() -> None:
    commit = Recorder()
    group: GroupCommit[int, int] = GroupCommit(commit)
    got = await asyncio.gather(*(group.submit_one(i) for i in range(6)))
    assert got == [0, 10, 20, 30, 40, 50]
    assert commit.steps == [[0], [1, 2, 3, 4, 5]]
    assert (group.batches, group.batched) == (2, 6)
    assert group.idle


async def test_limits_split_batches_and_a_call_may_span_them() -> None:
    commit = Recorder()
    group: GroupCommit[int, int] = GroupCommit(
        commit, max_items=3, weight=lambda i: i, max_weight=5
    )
    first = asyncio.ensure_future(group.submit([1]))
    rest = asyncio.ensure_future(group.submit([1, 1, 1, 1, 4, 9]))
    assert await first == [10]
    assert await rest == [10, 10, 10, 10, 40, 90]
    # At most 3 items and weight 5 per step; an item heavier than the limit goes alone.
    assert commit.steps == [[1], [1, 1, 1], [1, 4], [9]]


async def test_a_failed_step_fails_its_callers_only() -> None:
    commit = Recorder()
    group: GroupCommit[int, int] = GroupCommit(commit)
    commit.fail_on = 2
    lone = asyncio.ensure_future(group.submit_one(0))
    await asyncio.sleep(0)
    behind = [asyncio.ensure_future(group.submit_one(i)) for i in (1, 2)]
    assert await lone == 0
    for call in behind:
        with pytest.raises(RuntimeError, match="step failed"):
            await call
    assert commit.steps == [[0], [1, 2]]
    assert await group.submit_one(3) == 30


async def test_a_lone_item_runs_in_its_callers_task_only_when_asked() -> None:
    inline, tasked = Recorder(), Recorder()
    a: GroupCommit[int, int] = GroupCommit(inline, inline_alone=True)
    b: GroupCommit[int, int] = GroupCommit(tasked)
    me = asyncio.current_task()
    assert await a.submit_one(1) == 10 and await b.submit_one(1) == 10
    assert inline.tasks == [me]
    assert tasked.tasks[0] is not me
    # Inline or not, what queues behind a running step shares the next one.
    got = await asyncio.gather(*(a.submit_one(i) for i in range(4)))
    assert got == [0, 10, 20, 30] and inline.steps[1:] == [[0], [1, 2, 3]]


async def test_an_item_whose_caller_went_away_before_its_step_is_not_sent() -> None:
    commit = Recorder()
    group: GroupCommit[int, int] = GroupCommit(commit)
    first = asyncio.ensure_future(group.submit_one(1))
    await asyncio.sleep(0)  # its step is under way
    gone = asyncio.ensure_future(group.submit_one(2))
    kept = asyncio.ensure_future(group.submit_one(3))
    await asyncio.sleep(0)  # both queued behind it
    gone.cancel()
    assert await first == 10 and await kept == 30
    assert commit.steps == [[1], [3]]


@pytest.mark.parametrize("inline_alone", [False, True])
async def test_callers_a_step_answers_join_the_next_step_when_they_call_again_at_once(
    inline_alone: bool,
) -> None:
    """Tasks that call again as soon as they are answered (a server's handlers, a
    client's loop) share the next step: after a step of several callers, or with others
    waiting, the next step forms only once the callers had the loop back, so one of them
    does not go alone and leave the rest for a step after it."""
    commit = Recorder()
    group: GroupCommit[int, int] = GroupCommit(commit, inline_alone=inline_alone)

    async def twice(i: int) -> None:
        assert await group.submit_one(i) == i * 10
        assert await group.submit_one(100 + i) == (100 + i) * 10

    await asyncio.gather(*(twice(i) for i in range(8)))
    # The first call went alone (nothing was running); the seven queued behind it and
    # that first caller's second call are the next step; then the seven second calls.
    assert commit.steps == [[0], [1, 2, 3, 4, 5, 6, 7, 100], [101, 102, 103, 104, 105, 106, 107]]
