"""The shard's work queue: fresh prompts read lazily, failed ones offered again after a delay, and
the low-water mark that resume starts from."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from fleetgen.prompts.scan import Prompt


@dataclass(slots=True)
class QueuedPrompt:
    """A prompt of the shard waiting to be sent, sent, or waiting to be retried."""

    index: int  # position among the shard's valid prompts
    prompt: Prompt
    attempts: int = 0


class WorkQueue:
    """Fresh prompts read lazily from the shard, and failed ones waiting to be offered again.

    Also knows the low-water mark: the first prompt, in file order, that is not finished yet
    (every prompt before it is), which the store persists so a resume can start reading there.
    """

    def __init__(self, fresh: Iterator[tuple[int, int, int, Prompt]], start: tuple[int, int]) -> None:
        self._fresh: Iterator[tuple[int, int, int, Prompt]] | None = fresh
        self._retry: deque[QueuedPrompt] = deque()
        self._delayed = 0
        self.in_flight = 0
        self._changed = asyncio.Event()
        self.finished = asyncio.Event()
        self._taken: deque[tuple[int, int]] = deque()  # (index, line start) in the order read
        self._finished_indexes: set[int] = set()
        self._after_taken = start  # (index, offset) just past the last prompt read
        self.closed_early = False  # fresh prompts left untaken on purpose (close_fresh): a later try takes them

    def take(self) -> QueuedPrompt | None:
        if self._retry:
            item = self._retry.popleft()
        elif self._fresh is not None:
            position = next(self._fresh, None)
            if position is None:
                self._fresh = None
                self._check_finished()
                return None
            index, line_start, line_end, prompt = position
            self._taken.append((index, line_start))
            self._after_taken = (index + 1, line_end)
            item = QueuedPrompt(index, prompt)
        else:
            return None
        self.in_flight += 1
        return item

    def finish(self, item: QueuedPrompt) -> None:
        """The item's records are written: it will never be sent again."""
        self.in_flight -= 1
        self._finished_indexes.add(item.index)
        while self._taken and self._taken[0][0] in self._finished_indexes:
            self._finished_indexes.discard(self._taken.popleft()[0])
        self._check_finished()

    def close_fresh(self) -> None:
        """Take no more fresh prompts: those taken are finished (retried if they must be), the others are left for a
        later try, which resumes from the low-water mark. The shard then ends once nothing is in flight."""
        if self._fresh is None:
            return
        self._fresh = None
        self.closed_early = True
        self._check_finished()
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def fresh_exhausted(self) -> bool:
        """Every prompt of the shard has been handed out once (only retries may follow)."""
        return self._fresh is None

    def only_held(self, held: int) -> bool:
        """Nothing is left to send, to retry or in flight but ``held`` prompts taken and not yet finished."""
        return self._fresh is None and not self._retry and not self._delayed and self.in_flight == held

    def low_water(self) -> tuple[int, int]:
        return self._taken[0] if self._taken else self._after_taken

    def retry_later(self, item: QueuedPrompt, delay_s: float) -> None:
        self.in_flight -= 1
        self._delayed += 1
        asyncio.get_running_loop().call_later(delay_s, self._release, item)

    def _release(self, item: QueuedPrompt) -> None:
        self._delayed -= 1
        self._retry.append(item)
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_change(self) -> None:
        await self._changed.wait()

    def _check_finished(self) -> None:
        if self._fresh is None and not self._retry and not self._delayed and not self.in_flight:
            self.finished.set()
