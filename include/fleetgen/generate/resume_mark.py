"""Where a resumed shard starts reading its prompts again: the resume mark, checked against the output it covers.

A mark says every prompt before byte ``offset`` (``valid_before`` of them) is finished. Both stores of a shard's
output (``store.py`` on a local folder, ``object_store.py`` on an object store) keep one and resume from it here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from fleetgen.prompts.lines import Prompt
from fleetgen.prompts.planned import iter_shard_positions, resume_offset_problem


class MarkedResume:
    """What a shard store shares: ``shard_id``, ``done_ids`` (the prompt ids finished), ``mark`` and ``mark_where``
    (the file or object the mark came from, for the warnings)."""

    shard_id: int
    done_ids: set[bytes]
    mark: tuple[int, int] | None
    _log: logging.Logger | None

    @property
    def mark_where(self) -> str:
        raise NotImplementedError

    def checked_mark(self, shard: dict, mark: tuple[int, int] | None) -> tuple[int, int] | None:
        """``mark`` if the output can back it, else None (then the whole shard is read, finished prompts skipped).

        Every prompt before the mark is finished, so there are at least that many records; a mark without them
        (output removed by hand) would skip prompts."""
        if mark is None:
            return None
        end = shard.get("end")
        if not (0 <= mark[0] <= min(int(shard["count"]), len(self.done_ids)) and mark[1] >= int(shard["start"])
                and (end is None or mark[1] <= int(end))):
            if self._log is not None:
                self._log.warning("shard %d: %s does not match the output on disk; reading the whole shard",
                                  self.shard_id, self.mark_where)
            return None
        return mark

    def resume_point(self, shard: dict) -> tuple[int, int]:
        """(valid prompts before, byte offset) to start reading the shard's prompts from."""
        return self.mark or (0, int(shard["start"]))

    def pending_prompts(self, shard: dict) -> Iterator[tuple[int, int, int, Prompt]]:
        """The shard's prompts not yet finished, with their positions, from the resume point on.

        The plan's blocks are checked before the first prompt (``iter_shard_positions``); a mark that is
        not at a line start of the planned range (edited by hand) is dropped for the whole shard."""
        if self.mark is not None and (problem := resume_offset_problem(shard, self.mark[1])):
            if self._log is not None:
                self._log.warning("shard %d: ignoring %s: %s; reading the whole shard (finished prompts are "
                                  "skipped by id)", self.shard_id, self.mark_where, problem)
            self.mark = None
        valid_before, offset = self.resume_point(shard)
        return iter_shard_positions(shard["input_path"], offset, int(shard["count"]) - valid_before,
                                    skip_ids=self.done_ids, first_index=valid_before,
                                    length_limit=shard.get("length_limit"), end=shard.get("end"),
                                    blocks=shard.get("blocks"), shard=self.shard_id)
