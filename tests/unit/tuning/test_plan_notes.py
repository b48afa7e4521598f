"""What the plan leaves out or warns about: the cost of the longest prompt (warned at a halved cap or worse), the
workload without it, and the notes file the report reads."""

import pytest

from fleetgen.outputs import RunLayout
from fleetgen.tuning import ServerPlan, Workload
from fleetgen.tuning.plan_notes import LongPromptCost, read_plan_notes, without_longest, write_plan_notes

LONGEST = {"id": "long", "line": 61, "prompt_tokens": 175_000}
WORKLOAD = Workload(max_output_tokens=4096, prompt_tokens_mean=500.0, prompt_tokens_max=175_000, prompt_count=101)


def _plan(cap: int, context: int | None) -> ServerPlan:
    flags = {"--context-length": context} if context is not None else {}
    return ServerPlan(host="node0", gpu_ids=[0], port=30000, flags=flags, budget=[],
                      expected={"max_running_requests": cap, "max_mamba_cache_size": cap, "max_total_num_tokens": 1})


def test_a_prompt_that_cuts_the_cap_tenfold_is_named_with_the_context_and_cap_with_and_without_it():
    cost = LongPromptCost.of(LONGEST, _plan(7, 179_200), _plan(71, 5120))
    assert cost == LongPromptCost(id="long", line=61, prompt_tokens=175_000, server="node0:30000",
                                  context_with=179_200, context_without=5120, cap_with=7, cap_without=71)
    assert cost.describe() == (
        "prompt 'long' (line 61, ~175000 tokens estimated) sets every server's context: --context-length 179200 with "
        "it, 5120 without; max_running_requests of node0:30000 7 with it, 71 without it. Set the DAG parameter "
        "max_cap_cut_factor (e.g. 4) to set such prompts aside into rejects.jsonl, or shorten it")


@pytest.mark.parametrize("cap_without, warned", [(14, True), (13, False), (10, False)])
def test_a_prompt_is_warned_about_from_a_halved_cap_on(cap_without, warned):
    assert (LongPromptCost.of(LONGEST, _plan(7, 8192), _plan(cap_without, 4096)) is not None) is warned


def test_the_workload_without_the_longest_prompt_takes_the_next_longest():
    assert without_longest(WORKLOAD, 300) == Workload(max_output_tokens=4096, prompt_tokens_mean=300.0,
                                                      prompt_tokens_max=300, prompt_count=101)
    assert without_longest(WORKLOAD, 1000).prompt_tokens_mean == 500.0


@pytest.mark.parametrize("runner_up", [None, 0, 175_000, 200_000, 85_453])
def test_no_comparison_when_the_longest_cannot_halve_the_cap(runner_up):
    # 175,000 + 4,096 is just under twice 85,453 + 4,096: the longest request cannot even double the context
    assert without_longest(WORKLOAD, runner_up) is None


def test_twice_the_next_longest_request_is_compared():
    assert without_longest(WORKLOAD, 85_452).prompt_tokens_max == 85_452


def test_the_notes_go_to_the_run_folder_and_back(tmp_path):
    layout = RunLayout(tmp_path)
    cost = LongPromptCost.of(LONGEST, _plan(7, 179_200), _plan(71, 5120))
    write_plan_notes(layout, nodes_left_out={"node1": "cannot reach the node"}, long_prompt=cost)
    notes = read_plan_notes(layout)
    assert notes["nodes_left_out"] == [{"node": "node1", "reason": "cannot reach the node"}]
    assert notes["long_prompt"]["cap_with"] == 7 and notes["long_prompt"]["warning"] == cost.describe()
    write_plan_notes(layout, nodes_left_out={}, long_prompt=None)
    assert read_plan_notes(layout) == {"nodes_left_out": [], "long_prompt": None}


def test_a_run_without_notes_reads_as_nothing_left_out(tmp_path):
    assert read_plan_notes(RunLayout(tmp_path)) == {"nodes_left_out": [], "long_prompt": None}
    RunLayout(tmp_path).plan_notes.write_text("{torn")
    assert read_plan_notes(RunLayout(tmp_path)) == {"nodes_left_out": [], "long_prompt": None}
