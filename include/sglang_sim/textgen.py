"""Reproducible synthetic outputs: how long each answer is and what its text looks like.

The output length of a prompt is drawn from a gamma distribution (``sim.output_mean_tokens``,
``sim.output_shape``) seeded by a hash of the prompt's content and the node seed, so the same
prompt gets the same length on every server and every run. ``think_share`` of it is reasoning.
A draw at or above max_tokens finishes by "length" inside the reasoning (a runaway thinking trace),
so its answer is empty. Text is ~4 characters per token, sliced from a fixed buffer.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4   # chat-template tokens around each message
ASSISTANT_PREFIX_TOKENS = 3
_WORDS = ("the of and to in is that for it as with was on be by this are or from at which an have "
          "not they but one all we can there their has been if more when will would who so no "
          "first time two may into other than then its over only some these could also any after "
          "most between because each those both where through should under while such same "
          "model answer step check value consider result therefore hence assume given compute "
          "sum case first second next finally note thus total number so we get let").split()


def _build_buffer(size: int = 1 << 18) -> str:
    rng = random.Random(20240229)
    parts, length = [], 0
    while length < size:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 18)))
        sentence = sentence[0].upper() + sentence[1:] + ". "
        parts.append(sentence)
        length += len(sentence)
    return "".join(parts)


TEXT_BUFFER = _build_buffer()
_DOUBLE_BUFFER = TEXT_BUFFER * 2  # a slice may wrap around the end
_SENTENCE_STARTS = [0] + [i + 2 for i in range(len(TEXT_BUFFER) - 2) if TEXT_BUFFER[i] == "."]


def estimate_text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def messages_text(messages: list) -> str:
    return "\n".join(f"{m.get('role', '')}:{_content_text(m.get('content'))}" for m in messages
                     if isinstance(m, dict))


def estimate_chat_tokens(messages: list) -> int:
    body = sum(estimate_text_tokens(_content_text(m.get("content"))) for m in messages if isinstance(m, dict))
    return body + MESSAGE_OVERHEAD_TOKENS * len(messages) + ASSISTANT_PREFIX_TOKENS


def synth_text(tokens: int, offset: int) -> str:
    chars = tokens * CHARS_PER_TOKEN
    if chars <= 0:
        return ""
    start = _SENTENCE_STARTS[offset % len(_SENTENCE_STARTS)]
    if chars <= len(TEXT_BUFFER):
        return _DOUBLE_BUFFER[start:start + chars]
    return (TEXT_BUFFER * (chars // len(TEXT_BUFFER) + 2))[start:start + chars]


@dataclass(frozen=True)
class OutputPlan:
    reasoning_tokens: int
    answer_tokens: int
    finish_reason: str  # "stop" | "length"
    text_offset: int

    @property
    def completion_tokens(self) -> int:
        return self.reasoning_tokens + self.answer_tokens


def plan_output(prompt_key: str, *, seed: int, mean_tokens: float, shape: float, think_share: float,
                max_tokens: int, thinking: bool = True) -> OutputPlan:
    digest = hashlib.blake2b(f"{seed}\x00{prompt_key}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    natural = max(2, round(rng.gammavariate(shape, mean_tokens / shape)))
    thought = round(natural * think_share)
    reasoning = max(1, thought) if thinking else 0
    answer = max(1, natural - thought)
    offset = rng.randrange(1 << 30)
    max_tokens = max(1, max_tokens)
    if reasoning + answer <= max_tokens:
        return OutputPlan(reasoning, answer, "stop", offset)
    if thinking:
        return OutputPlan(max_tokens, 0, "length", offset)
    return OutputPlan(0, max_tokens, "length", offset)


def render_text(plan: OutputPlan, *, split_reasoning: bool) -> tuple[str | None, str]:
    """(reasoning_content, content). Without a reasoning parser the thinking is inline."""
    reasoning = synth_text(plan.reasoning_tokens, plan.text_offset) if plan.reasoning_tokens else None
    answer = synth_text(plan.answer_tokens, plan.text_offset + 7919 * CHARS_PER_TOKEN)
    if split_reasoning:
        return reasoning, answer
    if reasoning is None:
        return None, answer
    if plan.finish_reason == "length" and not plan.answer_tokens:
        return None, f"<think>\n{reasoning}"
    return None, f"<think>\n{reasoning}\n</think>\n\n{answer}"
