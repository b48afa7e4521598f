"""What a shard records beside its completions: the servers' /metrics over time and the server events."""

import httpx
import pytest

from generate_fakes import FakeFleet, fast_settings, metrics_page, read_jsonl, write_prompts

from fleetgen.errors import ServerError
from fleetgen.generate import run_shard_async
from fleetgen.generate.server_metrics import parse_metrics
from fleetgen.outputs import RunLayout

pytestmark = pytest.mark.anyio

# Two data-parallel ranks, as SGLang's scheduler writes them with --dp-size 2 (one series per dp_rank).
DP_PAGE = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 30.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 10.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.04
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.02
# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{dp_rank="0",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
sglang:spec_accept_length{dp_rank="1",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.4
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="False",model_name="m"} 1234.0
"""


def test_ranks_add_up_and_usages_average():
    sample = parse_metrics(DP_PAGE, server="n:30000")
    assert (sample.running, sample.queue) == (40, 2)
    assert sample.token_usage == pytest.approx(0.03) and sample.accept_length == pytest.approx(3.2)
    assert sample.mamba_usage is None and sample.gen_throughput is None
    row = sample.row(at=100.0, server="n:30000", cap=64)
    assert row == {"t": 100.0, "server": "n:30000", "cap": 64, "running": 40, "queue": 2, "token_usage": 0.03,
                   "accept_length": 3.2}


@pytest.mark.parametrize("page, why", [("<html>Not Found</html>", "Prometheus"),
                                        ("# TYPE x gauge\nx 1\n", "sglang:num_running_reqs")])
def test_a_page_that_is_not_sglangs_metrics_names_the_server(page, why):
    with pytest.raises(ServerError) as caught:
        parse_metrics(page, server="n:30000")
    assert why in str(caught.value) and "n:30000" in str(caught.value)


async def test_a_shard_samples_every_server_and_journals_its_failures(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 60)
    fleet = FakeFleet(2, delay_s=0.05)

    def cuda_error(prompt_id, n):
        return httpx.Response(500, json={"error": {"message": "CUDA error"}}) if n <= 2 else None

    fleet.behaviour["s1:1"] = cuda_error
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(sample_interval_s=0.02),
                          transport=fleet.transport())
    layout = RunLayout(tmp_path / "out")
    samples = read_jsonl(layout.shard_file("metrics", 0))
    assert {row["server"] for row in samples} == {"s0:1", "s1:1"} and fleet.scrapes["s0:1"] >= 2
    assert all(0 <= row["running"] <= 4 and "t" in row and "sent" in row for row in samples)
    assert any(row["running"] > 0 for row in samples)
    events = read_jsonl(layout.shard_file("events", 0))
    kinds = [(e["event"], e["server"]) for e in events]
    assert ("down", "s1:1") in kinds and ("recovered", "s1:1") in kinds and ("retried", "s1:1") in kinds
    down = next(e for e in events if e["event"] == "down")
    assert down["shard"] == 0 and "CUDA error" in down["reason"] and down["at"].endswith("Z")


async def test_no_metrics_series_when_sampling_is_off(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(1)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(sample_interval_s=0),
                          transport=fleet.transport())
    assert fleet.scrapes["s0:1"] == 0 and not RunLayout(tmp_path / "out").shard_file("metrics", 0).exists()


def test_the_fake_page_is_what_the_parser_reads():
    assert parse_metrics(metrics_page(3, 1), server="s").running == 3


def test_an_accept_length_of_zero_is_no_speculative_decoding():
    # SGLang 0.5.23 serves sglang:spec_accept_length 0 on a server without speculative decoding, and on a
    # rank that has not decoded yet; the row leaves it out rather than averaging the zero in
    zero_rank = DP_PAGE.replace('tp_rank="0"} 3.4', 'tp_rank="0"} 0.0')
    assert parse_metrics(zero_rank, server="n:30000").accept_length == pytest.approx(3.0)
    none = DP_PAGE.replace('tp_rank="0"} 3.0', 'tp_rank="0"} 0.0').replace('tp_rank="0"} 3.4', 'tp_rank="0"} 0.0')
    sample = parse_metrics(none, server="n:30000")
    assert sample.accept_length is None and "accept_length" not in sample.row(at=1.0, server="n:30000", cap=8)
