"""The shard's work queue (generate/queue.py): lazy fresh prompts, delayed retries, the low-water mark."""

import asyncio

import pytest

from fleetgen.generate.queue import QueuedPrompt, WorkQueue
from fleetgen.prompts.lines import Prompt


def positions(count: int, *, first_index: int = 0, first_offset: int = 0, line_bytes: int = 10):
    """(index, line start, line end, prompt) as the shard reader yields them."""
    for number in range(count):
        start = first_offset + number * line_bytes
        yield first_index + number, start, start + line_bytes, Prompt(id=f"p{first_index + number}", prompt="q")


def test_fresh_prompts_are_read_lazily_in_file_order():
    read = []

    def reader():
        for position in positions(3):
            read.append(position[0])
            yield position

    queue = WorkQueue(reader(), (0, 0))
    assert read == []
    first = queue.take()
    assert (first.index, first.prompt.id, first.attempts) == (0, "p0", 0) and read == [0]
    assert [queue.take().index, queue.take().index] == [1, 2] and queue.in_flight == 3
    assert not queue.fresh_exhausted
    assert queue.take() is None and queue.fresh_exhausted and queue.take() is None
    assert queue.in_flight == 3


def test_the_low_water_mark_waits_for_the_first_prompt_even_when_later_ones_finish_first():
    queue = WorkQueue(positions(3), (0, 0))
    first, second, third = queue.take(), queue.take(), queue.take()
    assert queue.low_water() == (0, 0)
    queue.finish(second)
    queue.finish(third)
    assert queue.low_water() == (0, 0)  # prompt 0 is still out: a resume must start at it
    queue.finish(first)
    assert queue.low_water() == (3, 30)  # everything read is finished: just past the last line


def test_the_low_water_mark_moves_one_finished_prompt_at_a_time():
    queue = WorkQueue(positions(3, first_index=5, first_offset=500), (5, 500))
    assert queue.low_water() == (5, 500)  # nothing read yet: where the shard resumes
    items = [queue.take(), queue.take(), queue.take()]
    queue.finish(items[0])
    assert queue.low_water() == (6, 510)
    queue.finish(items[2])
    assert queue.low_water() == (6, 510)
    queue.finish(items[1])
    assert queue.low_water() == (8, 530)


def test_the_low_water_mark_follows_prompt_indexes_not_byte_offsets():
    # line starts that coincide with other prompts' indexes must not be mistaken for them
    fresh = iter([(0, 1, 2, Prompt(id="a", prompt="q")), (1, 2, 3, Prompt(id="b", prompt="q")),
                  (2, 3, 4, Prompt(id="c", prompt="q"))])
    queue = WorkQueue(fresh, (0, 1))
    first, second, third = queue.take(), queue.take(), queue.take()
    queue.finish(second)
    queue.finish(first)
    assert queue.low_water() == (2, 3)
    queue.finish(third)
    assert queue.low_water() == (3, 4)


def test_a_prompt_offered_again_keeps_the_low_water_mark_until_it_finishes():
    async def scenario():
        queue = WorkQueue(positions(2), (0, 0))
        first, second = queue.take(), queue.take()
        queue.retry_later(first, 0.0)
        queue.finish(second)
        await queue.wait_for_change()
        assert queue.low_water() == (0, 0)
        again = queue.take()
        assert again is first and queue.in_flight == 1
        queue.finish(again)
        assert queue.low_water() == (2, 20)

    asyncio.run(scenario())


def test_retries_are_offered_before_fresh_prompts_and_only_after_their_delay():
    async def scenario():
        queue = WorkQueue(positions(5), (0, 0))
        first = queue.take()
        loop = asyncio.get_running_loop()
        queue.retry_later(first, 0.05)
        assert queue.in_flight == 0
        assert queue.take().index == 1  # the retry is not offered before its delay
        changed_at = loop.time()
        await asyncio.wait_for(queue.wait_for_change(), 2)
        assert loop.time() - changed_at >= 0.04
        assert queue.take() is first and queue.take().index == 2

    asyncio.run(scenario())


def test_several_retries_come_back_in_the_order_they_were_released():
    async def scenario():
        queue = WorkQueue(positions(3), (0, 0))
        a, b, c = queue.take(), queue.take(), queue.take()
        queue.retry_later(b, 0.0)
        queue.retry_later(c, 0.01)
        queue.retry_later(a, 0.02)
        await asyncio.sleep(0.05)
        assert [queue.take(), queue.take(), queue.take()] == [b, c, a]
        assert queue.take() is None and queue.in_flight == 3
        for item in (b, c, a):
            assert not queue.finished.is_set()
            queue.finish(item)
        assert queue.finished.is_set()

    asyncio.run(scenario())


def test_each_release_wakes_a_new_wait():
    async def scenario():
        queue = WorkQueue(positions(2), (0, 0))
        a, b = queue.take(), queue.take()
        queue.retry_later(a, 0.0)
        await asyncio.wait_for(queue.wait_for_change(), 1)
        waiter = asyncio.ensure_future(queue.wait_for_change())
        await asyncio.sleep(0.01)
        assert not waiter.done()  # the first release does not satisfy a later wait
        queue.retry_later(b, 0.0)
        await asyncio.wait_for(waiter, 1)

    asyncio.run(scenario())


def test_the_queue_is_finished_only_when_nothing_is_fresh_waiting_delayed_or_in_flight():
    async def scenario():
        queue = WorkQueue(positions(2), (0, 0))
        a, b = queue.take(), queue.take()
        assert queue.take() is None  # fresh prompts exhausted, two in flight
        queue.finish(b)
        assert not queue.finished.is_set()
        queue.retry_later(a, 0.02)  # none in flight, one delayed
        assert not queue.finished.is_set()
        await asyncio.wait_for(queue.wait_for_change(), 1)
        assert not queue.finished.is_set()  # one waiting to be retried
        again = queue.take()
        assert not queue.finished.is_set()
        queue.finish(again)
        assert queue.finished.is_set() and queue.in_flight == 0

    asyncio.run(scenario())


def test_an_empty_shard_is_finished_at_its_first_take():
    queue = WorkQueue(positions(0), (4, 400))
    assert not queue.finished.is_set()
    assert queue.take() is None and queue.finished.is_set() and queue.low_water() == (4, 400)


def test_finishing_before_the_reader_is_exhausted_does_not_finish_the_queue():
    queue = WorkQueue(positions(2), (0, 0))
    queue.finish(queue.take())
    queue.finish(queue.take())
    assert not queue.finished.is_set()  # the reader has not said it has nothing more
    assert queue.take() is None and queue.finished.is_set()


def test_a_queued_prompt_starts_with_no_attempts():
    item = QueuedPrompt(0, Prompt(id="p", prompt="q"))
    assert item.attempts == 0 and item.index == 0
    with pytest.raises(AttributeError):
        item.extra = 1  # slots: a typo in a field name fails loudly


# --- closed early (the tuning trial's time cap) ----------------------------------------------------------------

def test_a_queue_closed_early_takes_no_fresh_prompt_but_still_offers_its_retries():
    async def scenario():
        queue = WorkQueue(positions(10, line_bytes=10), (0, 0))
        a, b, c = queue.take(), queue.take(), queue.take()
        queue.finish(a)
        queue.retry_later(b, 0.0)
        await asyncio.wait_for(queue.wait_for_change(), 1)
        assert queue.closed_early is False
        queue.close_fresh()
        assert queue.closed_early and queue.fresh_exhausted
        again = queue.take()
        assert again is b and queue.take() is None  # the retry, then nothing fresh
        assert not queue.finished.is_set()  # two in flight
        queue.finish(again)
        queue.finish(c)
        assert queue.finished.is_set()
        # a later try starts at the first prompt never taken: 3 (byte 30)
        assert queue.low_water() == (3, 30)

    asyncio.run(scenario())


def test_closing_a_queue_with_nothing_in_flight_finishes_it_and_wakes_its_waiters():
    async def scenario():
        queue = WorkQueue(positions(5), (0, 0))
        queue.finish(queue.take())
        waiter = asyncio.ensure_future(queue.wait_for_change())
        await asyncio.sleep(0)
        queue.close_fresh()
        await asyncio.wait_for(waiter, 1)
        assert queue.finished.is_set() and queue.low_water() == (1, 10)
        later = asyncio.ensure_future(queue.wait_for_change())  # a wait after the close waits for the next change
        await asyncio.sleep(0.01)
        assert not later.done()
        later.cancel()

    asyncio.run(scenario())


def test_closing_a_queue_whose_prompts_were_all_taken_is_not_closing_early():
    queue = WorkQueue(positions(1), (0, 0))
    queue.finish(queue.take())
    assert queue.take() is None and queue.finished.is_set()
    queue.close_fresh()
    assert not queue.closed_early


def test_only_held_means_nothing_fresh_retried_delayed_or_in_flight_beyond_the_held():
    async def scenario():
        queue = WorkQueue(positions(3), (0, 0))
        a, b = queue.take(), queue.take()
        assert not queue.only_held(2)  # a fresh prompt is left
        c = queue.take()
        assert queue.take() is None
        assert queue.only_held(3) and not queue.only_held(2) and not queue.only_held(4)
        queue.retry_later(c, 0.0)  # delayed
        assert not queue.only_held(2)
        await asyncio.wait_for(queue.wait_for_change(), 1)
        assert not queue.only_held(2)  # waiting to be retried
        queue.finish(queue.take())
        assert queue.only_held(2)
        queue.finish(a)
        queue.finish(b)
        assert queue.only_held(0)

    asyncio.run(scenario())
