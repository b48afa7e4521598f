"""One oversized prompt must not reshape the fleet: it is set aside at scan time, the plan is sized for
the others, and shards and validation skip it the same way."""

import json
import math

from fleetgen.prompts.length import LengthLimit, length_limit
from fleetgen.prompts.planned import iter_shard
from fleetgen.prompts.scan import iter_prompt_ids, plan_shards, scan_prompts
from fleetgen.tuning.geometry import context_length_of
from fleetgen.tuning.planner import TunerBounds, Workload, plan_server
from fleetgen.tuning.profile import LaunchOptions, profile_model

# The seed's launch options without its --context-length: the plan then sizes the context itself.
ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--mamba-radix-cache-strategy", "extra_buffer"]
MAX_TOKENS = 4096


def write_prompts(path, *, huge_at=None):
    with path.open("w") as handle:
        for number in range(300):
            if number == huge_at:
                handle.write(json.dumps({"id": "huge", "prompt": "lorem ipsum " * (5 * 1024 * 1024 // 12)}) + "\n")
            handle.write(json.dumps({"id": f"p{number:03d}", "messages": [
                {"role": "user", "content": f"question {number}: " + "explain the proof in detail " * (number % 40)}]})
                + "\n")
    return path


def planned_running_requests(cases, seed_config, scan):
    options = LaunchOptions.from_args(ARGS)
    profile = profile_model(seed_config, cases.SEED_WEIGHTS_BYTES, options)
    workload = Workload(max_output_tokens=MAX_TOKENS, prompt_tokens_mean=scan.est_prompt_tokens_mean,
                        prompt_tokens_max=scan.est_prompt_tokens_max, prompt_count=scan.count)
    plan = plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[cases.gpu_row(0)], profile=profile,
                       options=options, workload=workload, bounds=TunerBounds())
    return plan.expected["max_running_requests"], plan.flags["--context-length"]


def test_a_5_mb_prompt_is_set_aside_and_the_plan_is_the_one_without_it(tmp_path, cases, seed_config):
    limit = length_limit(model_context=context_length_of(seed_config), max_tokens=MAX_TOKENS)
    with_huge = write_prompts(tmp_path / "with.jsonl", huge_at=150)
    without = write_prompts(tmp_path / "without.jsonl")
    rejects = tmp_path / "rejects.jsonl"
    scan = scan_prompts(with_huge, rejects_path=rejects, length_limit=limit)
    clean = scan_prompts(without, length_limit=limit)

    assert (scan.count, scan.rejected, scan.too_long) == (300, 1, 1)
    [reject] = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert reject["id"] == "huge" and reject["line"] == 151
    assert reject["error"].startswith("too long for the context: ~1310")
    assert "(the model's context length)" in reject["error"]
    assert f"+ max_tokens {MAX_TOKENS} > {context_length_of(seed_config)}" in reject["error"]
    assert (scan.prompt_chars_mean, scan.prompt_chars_max) == (clean.prompt_chars_mean, clean.prompt_chars_max)
    assert planned_running_requests(cases, seed_config, scan) == planned_running_requests(cases, seed_config, clean)
    # Without the limit (as before) the one prompt sizes every server for the model's whole context.
    unlimited = scan_prompts(with_huge)
    mrr_unlimited, context_unlimited = planned_running_requests(cases, seed_config, unlimited)
    mrr, context = planned_running_requests(cases, seed_config, scan)
    assert context_unlimited == context_length_of(seed_config) > context and mrr_unlimited < mrr

    # Shards carry the limit and skip the same prompt; so does the list validation expects.
    shards = plan_shards(with_huge, shard_size=100, scan=scan)
    assert all(LengthLimit.from_dict(s["length_limit"]) == limit for s in shards)
    ids = [p.id for s in shards for p in iter_shard(s["input_path"], s["start"], s["count"],
                                                    length_limit=s["length_limit"])]
    assert ids == [f"p{n:03d}" for n in range(300)]
    assert list(iter_prompt_ids(with_huge, length_limit=scan.length_limit)) == ids


def test_the_context_comes_from_the_servers_flag_then_the_param_then_the_model():
    flag = length_limit(model_context=262144, max_tokens=10, launch_context=8192, param_context=4096)
    assert flag.context_tokens == 8192 and flag.source.startswith("--context-length")
    capped = length_limit(model_context=262144, max_tokens=10, param_context=32768)
    assert (capped.context_tokens, capped.source) == (32768, "the context_length param")
    above = length_limit(model_context=32768, max_tokens=10, param_context=65536)
    assert above.context_tokens == 32768 and "below the requested cap" in above.source


def test_a_prompts_own_max_tokens_counts_against_the_context(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "x" * 400}) + "\n"
                    + json.dumps({"id": "b", "prompt": "x" * 400, "sampling": {"max_tokens": 1000}}) + "\n")
    scan = scan_prompts(path, length_limit=LengthLimit(context_tokens=1000, max_tokens=500, source="test"))
    assert (scan.count, scan.too_long) == (1, 1)  # 100 + 500 fits; 100 + 1000 does not


def test_every_prompt_set_aside_is_counted(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": name, "prompt": "x" * size}) + "\n"
                            for name, size in (("a", 400), ("b", 8000), ("c", 400), ("d", 9000), ("e", 12000))))
    scan = scan_prompts(path, length_limit=LengthLimit(context_tokens=1000, max_tokens=500, source="test"))
    assert (scan.count, scan.too_long) == (2, 3)


def test_a_prompts_own_max_tokens_above_the_runs_is_planned_for(tmp_path, cases, seed_config):
    path = write_prompts(tmp_path / "p.jsonl")
    with path.open("a") as handle:
        handle.write(json.dumps({"id": "long-answer", "prompt": "prove it " * 300,
                                 "sampling": {"max_tokens": 2 * MAX_TOKENS}}) + "\n")
    limit = length_limit(model_context=context_length_of(seed_config), max_tokens=MAX_TOKENS)
    scan = scan_prompts(path, length_limit=limit)
    assert (scan.count, scan.own_max_tokens_max) == (301, 2 * MAX_TOKENS)
    assert scan.request_tokens_max == math.ceil(len("prove it " * 300) / 4) + 2 * MAX_TOKENS

    def planned_context(output_tokens):
        options = LaunchOptions.from_args(ARGS)
        workload = Workload(max_output_tokens=output_tokens, prompt_tokens_mean=scan.est_prompt_tokens_mean,
                            prompt_tokens_max=scan.est_prompt_tokens_max, prompt_count=scan.count)
        plan = plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[cases.gpu_row(0)],
                           profile=profile_model(seed_config, cases.SEED_WEIGHTS_BYTES, options), options=options,
                           workload=workload, bounds=TunerBounds())
        return int(plan.flags["--context-length"])

    # The run's budget alone leaves that prompt's request no room (SGLang would answer 400) ...
    assert planned_context(MAX_TOKENS) < scan.request_tokens_max
    # ... the output budget derive_plan takes from the scan does.
    assert planned_context(scan.output_tokens_max(MAX_TOKENS)) >= scan.request_tokens_max


def limit_of(context_tokens=1000, max_tokens=500):
    return LengthLimit(context_tokens=context_tokens, max_tokens=max_tokens, source="test")


def test_characters_round_up_to_whole_tokens():
    from fleetgen.prompts.length import estimated_tokens

    assert [estimated_tokens(chars) for chars in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_a_prompt_that_fills_the_context_exactly_fits_and_one_more_token_does_not():
    from fleetgen.prompts.lines import Prompt

    limit = limit_of(context_tokens=1000, max_tokens=500)
    exact = Prompt(id="exact", prompt="x" * 2000)  # 500 tokens + 500 = 1000
    assert limit.request_tokens(exact) == 1000 and limit.problem(exact) is None
    over = Prompt(id="over", prompt="x" * 2001)  # 501 tokens + 500
    assert limit.request_tokens(over) == 1001
    assert limit.problem(over) == ("too long for the context: ~501 prompt tokens (estimated at 4 characters per "
                                   "token) + max_tokens 500 > 1000 (test)")


def test_a_prompts_own_max_tokens_replaces_the_runs_in_its_budget():
    from fleetgen.prompts.lines import Prompt

    limit = limit_of(context_tokens=1000, max_tokens=500)
    own = Prompt(id="own", messages=[{"role": "user", "content": "x" * 400}], sampling={"max_tokens": 900})
    assert limit.output_tokens(own) == 900 and limit.request_tokens(own) == 1000 and limit.problem(own) is None
    smaller = Prompt(id="small", prompt="x" * 2400, sampling={"max_tokens": 400})  # 600 + 400: the run's would not fit
    assert limit.output_tokens(smaller) == 400 and limit.problem(smaller) is None
    assert limit.output_tokens(Prompt(id="plain", prompt="x")) == 500
    assert "+ max_tokens 901 > 1000" in limit.problem(
        Prompt(id="own", messages=[{"role": "user", "content": "x" * 400}], sampling={"max_tokens": 901}))


def test_a_limit_goes_through_json_and_back_unchanged():
    limit = LengthLimit(context_tokens=32768, max_tokens=4096, source="the context_length param")
    as_json = json.loads(json.dumps(limit.to_dict()))
    assert as_json == {"context_tokens": 32768, "max_tokens": 4096, "source": "the context_length param"}
    assert LengthLimit.from_dict(as_json) == limit
    assert LengthLimit.from_dict(limit) is limit and LengthLimit.from_dict(None) is None
    from_strings = LengthLimit.from_dict({"context_tokens": "32768", "max_tokens": "4096", "source": 7})
    assert from_strings == LengthLimit(context_tokens=32768, max_tokens=4096, source="7")


def test_each_source_of_the_context_is_named_and_a_cap_equal_to_the_models_is_kept():
    model = length_limit(model_context=32768, max_tokens=10)
    assert (model.context_tokens, model.max_tokens, model.source) == (32768, 10, "the model's context length")
    param = length_limit(model_context=32768, max_tokens=10, param_context=32768)
    assert (param.context_tokens, param.source) == (32768, "the context_length param")
    flag = length_limit(model_context=32768, max_tokens=10, launch_context=32768, param_context=8192)
    assert (flag.context_tokens, flag.source) == (32768, "--context-length in the fleet's server.extra_args")
    flag_above = length_limit(model_context=32768, max_tokens=10, launch_context=65536)
    assert (flag_above.context_tokens, flag_above.source) == (
        32768, "the model's context length, below the requested cap")
    assert length_limit(model_context=32768, max_tokens=10, launch_context=0, param_context=None).context_tokens == 32768


def write_short_prompts_and_one_long(path, *, long_at=60, long_chars=700_000):
    """100 short chat prompts and, at line ``long_at + 1``, one of ``long_chars`` characters: it fits the model's
    context, so only the cap-cut factor can set it aside."""
    with path.open("w") as handle:
        for number in range(100):
            if number == long_at:
                handle.write(json.dumps({"id": "long", "prompt": "x" * long_chars}) + "\n")
            handle.write(json.dumps({"id": f"s{number:03d}", "prompt": f"question {number}: " + "why " * 60}) + "\n")
    return path


def test_one_700_kb_prompt_cuts_every_servers_cap_unless_the_cap_cut_factor_sets_it_aside(tmp_path, cases, seed_config):
    limit = length_limit(model_context=context_length_of(seed_config), max_tokens=MAX_TOKENS)
    with_long = write_short_prompts_and_one_long(tmp_path / "with.jsonl")
    clean = scan_prompts(write_short_prompts_and_one_long(tmp_path / "without.jsonl", long_at=None),
                         length_limit=limit)
    kept = scan_prompts(with_long, length_limit=limit)
    assert (kept.count, kept.rejected) == (101, 0)  # it fits the model's context: nothing sets it aside
    assert kept.longest == {"id": "long", "line": 61, "prompt_tokens": 175_000}
    assert kept.runner_up_prompt_tokens == clean.est_prompt_tokens_max
    cut_cap, cut_context = planned_running_requests(cases, seed_config, kept)
    cap, context = planned_running_requests(cases, seed_config, clean)
    assert (cut_cap, cut_context, cap, context) == (7, 179_200, 71, 5120)  # docs/shards.md §4

    rejects = tmp_path / "rejects.jsonl"
    scan = scan_prompts(with_long, rejects_path=rejects, length_limit=limit, max_cap_cut_factor=4)
    assert (scan.count, scan.rejected, scan.too_long) == (100, 1, 1)
    assert planned_running_requests(cases, seed_config, scan) == (cap, context)
    median = clean.request_tokens_median
    [reject] = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert (reject["id"], reject["line"]) == ("long", 61)
    assert reject["error"] == (f"too long for the context: ~175000 prompt tokens (estimated at 4 characters per "
                               f"token) + max_tokens {MAX_TOKENS} > {4 * median} (max_cap_cut_factor 4 × the median "
                               f"request of {median} tokens: a longer prompt would cut every server's running "
                               f"requests by more than that)")
    shards = plan_shards(with_long, shard_size=30, scan=scan)
    assert [p.id for s in shards for p in iter_shard(s["input_path"], s["start"], s["count"],
                                                     length_limit=s["length_limit"])] == [f"s{n:03d}" for n in range(100)]


def test_a_cap_cut_factor_that_no_prompt_exceeds_scans_the_file_once(tmp_path, monkeypatch):
    from fleetgen.prompts import scan as scan_module

    limit = LengthLimit(context_tokens=262_144, max_tokens=MAX_TOKENS, source="test")
    path = write_short_prompts_and_one_long(tmp_path / "p.jsonl", long_chars=4 * 3 * MAX_TOKENS)
    passes = []
    real = scan_module._scan_once
    monkeypatch.setattr(scan_module, "_scan_once", lambda *args: passes.append(args[3]) or real(*args))
    scan = scan_prompts(path, length_limit=limit, max_cap_cut_factor=4)  # ~3.9 × the median request: kept
    assert (scan.count, scan.rejected, passes) == (101, 0, [limit])


def test_the_cap_cut_limit_is_factor_times_the_median_request_and_only_tighter():
    from fleetgen.prompts.length import cap_cut_limit

    limit = LengthLimit(context_tokens=100_000, max_tokens=4096, source="the model's context length")
    assert cap_cut_limit(limit, 5000, 20_001, 4) == LengthLimit(
        context_tokens=20_000, max_tokens=4096,
        source="max_cap_cut_factor 4 × the median request of 5000 tokens: a longer prompt would cut every server's "
               "running requests by more than that")
    assert cap_cut_limit(limit, 5000, 20_000, 4) is None  # exactly the factor: kept
    assert cap_cut_limit(limit, 5000, 20_001, 2.5).context_tokens == 12_500
    assert cap_cut_limit(limit, 5000, 90_000, 0) is None  # off
    assert cap_cut_limit(limit, 30_000, 100_000, 4) is None  # no tighter than the context itself
    assert cap_cut_limit(None, 5000, 90_000, 4) is None and cap_cut_limit(limit, None, None, 4) is None


def test_the_cap_cut_limit_is_none_when_the_factor_reaches_the_context_exactly_or_a_request_figure_is_missing():
    from fleetgen.prompts.length import cap_cut_limit

    limit = LengthLimit(context_tokens=100_000, max_tokens=4096, source="the model's context length")
    assert cap_cut_limit(limit, 25_000, 100_001, 4) is None  # 4 × 25,000 is the context: no tighter
    assert cap_cut_limit(limit, 24_999, 100_001, 4).context_tokens == 99_996
    assert cap_cut_limit(limit, None, 90_000, 4) is None and cap_cut_limit(limit, 5000, None, 4) is None


def test_a_cap_cut_factor_without_a_length_limit_is_refused(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="^max_cap_cut_factor needs the length_limit that gives each prompt its "
                                         "output budget$"):
        scan_prompts(write_short_prompts_and_one_long(tmp_path / "p.jsonl"), max_cap_cut_factor=4)
