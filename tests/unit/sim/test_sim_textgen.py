"""Reproducible output lengths, their distribution, and reasoning/answer rendering."""

from sglang_sim.node import SimSettings
from sglang_sim.textgen import estimate_chat_tokens, plan_output, render_text

DEFAULTS = SimSettings()


def _plan(key, max_tokens=4096, **kw):
    return plan_output(key, seed=DEFAULTS.seed, mean_tokens=DEFAULTS.output_mean_tokens,
                       shape=DEFAULTS.output_shape, think_share=DEFAULTS.think_share, max_tokens=max_tokens, **kw)


def test_same_prompt_same_output_and_seed_changes_it():
    assert _plan("what is 2+2?") == _plan("what is 2+2?")
    other_seed = plan_output("what is 2+2?", seed=7, mean_tokens=2640, shape=4, think_share=0.85, max_tokens=4096)
    assert other_seed != _plan("what is 2+2?")


def test_length_distribution_matches_the_workload():
    plans = [_plan(f"prompt {i}") for i in range(3000)]
    mean = sum(p.completion_tokens for p in plans) / len(plans)
    truncated = sum(p.finish_reason == "length" for p in plans) / len(plans)
    assert 2350 < mean < 2650                  # the seed workload: ~2,500 on average
    assert 0.08 < truncated < 0.2              # some hit max_tokens
    assert all(p.completion_tokens <= 4096 for p in plans)


def test_truncated_generation_has_no_answer():
    plan = _plan("long one", max_tokens=20)
    assert plan.finish_reason == "length" and plan.completion_tokens == 20 and plan.answer_tokens == 0
    reasoning, content = render_text(plan, split_reasoning=True)
    assert content == "" and len(reasoning) == 80
    assert render_text(plan, split_reasoning=False) == (None, "<think>\n" + reasoning)


def test_split_and_inline_reasoning():
    plan = _plan("explain tides", max_tokens=100_000)
    assert plan.finish_reason == "stop"
    reasoning, answer = render_text(plan, split_reasoning=True)
    assert len(reasoning) == 4 * plan.reasoning_tokens and len(answer) == 4 * plan.answer_tokens
    _, inline = render_text(plan, split_reasoning=False)
    assert inline == f"<think>\n{reasoning}\n</think>\n\n{answer}"


def test_thinking_off_gives_only_an_answer():
    plan = _plan("explain tides", max_tokens=100_000, thinking=False)
    assert plan.reasoning_tokens == 0
    assert plan.answer_tokens == _plan("explain tides", max_tokens=100_000).answer_tokens


def test_prompt_token_estimate():
    messages = [{"role": "system", "content": "x" * 40}, {"role": "user", "content": [{"type": "text", "text": "y" * 8}]}]
    assert estimate_chat_tokens(messages) == 10 + 2 + 4 * 2 + 3
