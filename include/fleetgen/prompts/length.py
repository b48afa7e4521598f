"""Prompts too long for the context the servers will run with, told apart at scan time (docs/shards.md §4).

One oversized prompt must not reshape the fleet: the plan sizes every server's context for the
longest prompt plus the largest ``max_tokens`` (a prompt's own, when above the run's), so a single
5 MB prompt would push the context to the model's maximum and cut the running requests of every server, only to fail with HTTP 400 anyway (SGLang
refuses a request whose input plus ``max_new_tokens`` exceeds the context:
``TokenizerManager._validate_one_request`` in sglang/srt/managers/tokenizer_manager.py). Such a
prompt goes to ``rejects.jsonl`` with the reason instead, and the plan sees only the accepted ones.

The context is, first found: ``--context-length`` in the fleet's ``server.extra_args``, the
``context_length`` DAG param, the model's own (config.json, as SGLang derives it); a cap above the
model's own is held to the model's.

Token counts before generation are estimates: the message contents' characters / 4
(``CHARS_PER_TOKEN``), the same estimate the plan sizes the context with, so every accepted prompt
fits the planned context by the same measure. Chat-template tokens are not counted. A prompt is set
aside only when this estimate plus its ``max_tokens`` (its own override, else the run's) exceeds the
context. The estimate is an average, not a bound: dense text (code, CJK) has more tokens per
character, so such a prompt close to the limit may still pass the scan and then fail alone with a
400 in the errors file, never changing the fleet's shape.

A prompt that fits the context can still reshape the fleet: the planned context is the longest request's
(prompt + output budget), and with KV for each running request at that context (the full-context plan, the
first run on a fleet) every server's cap falls in proportion (one 700 kB prompt among short ones: 71
running requests to 7). ``max_cap_cut_factor`` (a DAG parameter, off by default) sets such prompts aside
too: a request needing more than that many times the median request's tokens (``cap_cut_limit``), so that
no single prompt can cut the cap by more than about that factor against a typical request's context.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fleetgen.prompts.lines import Prompt

CHARS_PER_TOKEN = 4


def estimated_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


@dataclass(frozen=True)
class LengthLimit:
    """The context a prompt plus its output must fit in; JSON-safe through ``to_dict``."""

    context_tokens: int
    max_tokens: int  # the run's; a prompt's own "max_tokens" override wins for that prompt
    source: str  # where the context comes from, for the reject reason and the log

    def output_tokens(self, prompt: Prompt) -> int:
        """The prompt's output budget: its own ``sampling.max_tokens``, else the run's."""
        return prompt.sampling.get("max_tokens", self.max_tokens)

    def request_tokens(self, prompt: Prompt) -> int:
        """Estimated prompt tokens plus the prompt's output budget: the context its request can fill."""
        return estimated_tokens(prompt.content_chars()) + self.output_tokens(prompt)

    def problem(self, prompt: Prompt) -> str | None:
        """Why ``prompt`` cannot fit, or None when it (by the estimate) does."""
        prompt_tokens = estimated_tokens(prompt.content_chars())
        output = self.output_tokens(prompt)
        if prompt_tokens + output <= self.context_tokens:
            return None
        return (f"too long for the context: ~{prompt_tokens} prompt tokens (estimated at {CHARS_PER_TOKEN} characters "
                f"per token) + max_tokens {output} > {self.context_tokens} ({self.source})")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: "dict | LengthLimit | None") -> "LengthLimit | None":
        if data is None or isinstance(data, LengthLimit):
            return data
        return cls(context_tokens=int(data["context_tokens"]), max_tokens=int(data["max_tokens"]),
                   source=str(data["source"]))


def length_limit(*, model_context: int, max_tokens: int, launch_context: int | None = None,
                 param_context: int | None = None) -> LengthLimit:
    """The limit for a run: the servers' ``--context-length`` if the fleet sets one, else the user's
    ``context_length`` param, else the model's own context; never above the model's."""
    if launch_context:
        context, source = launch_context, "--context-length in the fleet's server.extra_args"
    elif param_context:
        context, source = param_context, "the context_length param"
    else:
        context, source = model_context, "the model's context length"
    if context > model_context:
        context, source = model_context, "the model's context length, below the requested cap"
    return LengthLimit(context_tokens=context, max_tokens=max_tokens, source=source)


def cap_cut_limit(limit: LengthLimit | None, median_request_tokens: int | None, request_tokens_max: int | None,
                  factor: float) -> LengthLimit | None:
    """The tighter limit under which no accepted request needs more than ``factor`` × the median request's
    tokens, or None when none does (or ``factor`` is 0: off)."""
    if not factor or limit is None or median_request_tokens is None or request_tokens_max is None:
        return None
    context = math.floor(factor * median_request_tokens)
    if request_tokens_max <= context or context >= limit.context_tokens:
        return None
    return LengthLimit(context_tokens=context, max_tokens=limit.max_tokens,
                       source=f"max_cap_cut_factor {factor:g} × the median request of {median_request_tokens} "
                              f"tokens: a longer prompt would cut every server's running requests by more than "
                              f"that")
