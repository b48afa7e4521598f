"""What a shard records beside its completions: the servers' /metrics over time and the server events."""

import asyncio
import logging
import os
import re
import time
from types import SimpleNamespace

import httpx
import pytest

from generate_fakes import FakeFleet, fast_settings, metrics_page, read_jsonl, write_prompts

from fleetgen.errors import ServerError
from fleetgen.generate import run_shard_async
from fleetgen.generate import watch
from fleetgen.generate.server_metrics import parse_metrics
from fleetgen.generate.settings import ServerEndpoint
from fleetgen.generate.watch import SCRAPE_TIMEOUT_S, EventJournal, JsonlAppender, MetricsScraper
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
                          options=fleet.options())
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
                          options=fleet.options())
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


# The journal and the scraper on their own, against an in-process fake server.

def endpoint(name: str, cap: int = 0) -> ServerEndpoint:
    return ServerEndpoint(name=name, url=f"http://{name}/", max_in_flight=4, effective_max_running_requests=cap)


class Pages:
    """``send`` for the scraper: each server's answer by name (a Response, an exception, or a page)."""

    def __init__(self, **answers) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    async def send(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers[f"{request.url.host}:{request.url.port}"]
        if isinstance(answer, Exception):
            raise answer
        return answer if isinstance(answer, httpx.Response) else httpx.Response(200, text=answer)


def scraper(tmp_path, servers, pages, *, in_flight=lambda name: 0, is_down=None, interval_s=1.0, log="watch"):
    extra = {"is_down": is_down} if is_down else {}
    return MetricsScraper(servers=servers, send=pages.send, headers=httpx.Headers({"Authorization": "Bearer k"}),
                          interval_s=interval_s, path=tmp_path / "metrics" / "shard-00002.jsonl", in_flight=in_flight,
                          log=logging.getLogger(log), shard_id=2, **extra)


def test_each_server_gets_its_own_row_with_its_own_cap_and_this_shards_requests(tmp_path):
    pages = Pages(**{"a:1": metrics_page(3, 1), "b:2": metrics_page(7)})
    sent = {"a:1": 2, "b:2": 5}
    watcher = scraper(tmp_path, [endpoint("a:1", cap=16), endpoint("b:2", cap=64)], pages, in_flight=sent.get)
    before = time.time()
    asyncio.run(watcher.scrape_all())
    rows = {row["server"]: row for row in read_jsonl(watcher._out.path)}
    assert set(rows) == {"a:1", "b:2"} and watcher.samples == 2
    assert {k: v for k, v in rows["a:1"].items() if k != "t"} == {"server": "a:1", "cap": 16, "running": 3.0,
                                                                 "queue": 1.0, "token_usage": 0.03, "sent": 2}
    assert (rows["b:2"]["cap"], rows["b:2"]["running"], rows["b:2"]["sent"]) == (64, 7.0, 5)
    assert before - 0.01 <= rows["a:1"]["t"] <= time.time() + 0.01  # wall-clock seconds
    assert sorted(str(r.url) for r in pages.requests) == ["http://a:1/metrics", "http://b:2/metrics"]
    request = pages.requests[0]
    assert request.method == "GET" and request.headers["authorization"] == "Bearer k"
    assert request.extensions["timeout"] == {"connect": SCRAPE_TIMEOUT_S, "read": SCRAPE_TIMEOUT_S,
                                             "write": SCRAPE_TIMEOUT_S, "pool": SCRAPE_TIMEOUT_S}


def test_a_server_marked_down_is_not_asked(tmp_path):
    pages = Pages(**{"a:1": metrics_page(1), "b:2": metrics_page(2)})
    watcher = scraper(tmp_path, [endpoint("a:1"), endpoint("b:2")], pages, is_down=lambda name: name == "b:2")
    asyncio.run(watcher.scrape_all())
    assert [row["server"] for row in read_jsonl(watcher._out.path)] == ["a:1"]
    assert [str(r.url) for r in pages.requests] == ["http://a:1/metrics"]


def test_every_server_is_asked_unless_told_otherwise(tmp_path):
    pages = Pages(**{"a:1": metrics_page(1)})
    watcher = MetricsScraper(servers=[endpoint("a:1")], send=pages.send, headers=httpx.Headers(), interval_s=1.0,
                             path=tmp_path / "m.jsonl", in_flight=lambda name: 0, log=logging.getLogger("w"),
                             shard_id=0)
    asyncio.run(watcher.scrape_all())
    assert watcher.samples == 1


@pytest.mark.parametrize("answer, why", [
    (httpx.Response(503, text="busy"), "/metrics answered HTTP 503"),
    (httpx.ConnectError("refused"), "refused"),
    (httpx.ReadTimeout("slow"), "slow"),
    ("<html>not metrics</html>", "not in the Prometheus text format"),
    ("# TYPE x gauge\nx 1\n", "has no sglang:num_running_reqs")])
def test_a_failed_scrape_is_skipped_and_warned_about_once_per_server(tmp_path, caplog, answer, why):
    pages = Pages(**{"a:1": answer, "b:2": answer, "c:3": metrics_page(4)})
    watcher = scraper(tmp_path, [endpoint("a:1"), endpoint("b:2"), endpoint("c:3")], pages)
    with caplog.at_level(logging.WARNING, logger="watch"):
        asyncio.run(watcher.scrape_all())
        asyncio.run(watcher.scrape_all())
    assert [row["server"] for row in read_jsonl(watcher._out.path)] == ["c:3", "c:3"] and watcher.samples == 2
    warnings = sorted(r.getMessage() for r in caplog.records)
    assert len(warnings) == 2  # one per failing server, not one per scrape
    assert warnings[0].startswith("shard 2: no metrics from a:1 (") and warnings[1].startswith("shard 2: no metrics "
                                                                                               "from b:2 (")
    assert why in warnings[0] and warnings[0].endswith("); its occupancy has gaps")
    if not isinstance(answer, httpx.TransportError):  # the server's own errors name it
        assert warnings[0].startswith("shard 2: no metrics from a:1 ([server a:1] ")
        assert warnings[1].startswith("shard 2: no metrics from b:2 ([server b:2] ")


def test_a_page_with_bytes_that_are_not_utf8_is_still_read(tmp_path):
    page = metrics_page(5).encode().replace(b"The number of running requests.", b"requ\xeates")  # Latin-1
    watcher = scraper(tmp_path, [endpoint("a:1")], Pages(**{"a:1": httpx.Response(200, content=page)}))
    asyncio.run(watcher.scrape_all())
    assert [row["running"] for row in read_jsonl(watcher._out.path)] == [5.0]


def test_a_shard_that_never_sampled_samples_once_as_it_finishes_and_closes_its_file(tmp_path):
    pages = Pages(**{"a:1": metrics_page(2)})
    watcher = scraper(tmp_path, [endpoint("a:1")], pages)
    asyncio.run(watcher.finish())
    assert len(read_jsonl(watcher._out.path)) == 1 and watcher._out._fd == -1


def test_a_shard_samples_every_server_once_more_as_it_finishes_the_servers_as_it_leaves_them(tmp_path):
    pages = Pages(**{"a:1": metrics_page(2), "b:1": metrics_page(0)})
    watcher = scraper(tmp_path, [endpoint("a:1"), endpoint("b:1")], pages)
    asyncio.run(watcher.scrape_all())
    pages.answers["a:1"] = metrics_page(0)  # its last requests returned: the last row counts their tokens
    asyncio.run(watcher.finish())
    assert len(pages.requests) == 4 and watcher._out._fd == -1
    rows = read_jsonl(tmp_path / "metrics" / "shard-00002.jsonl")
    assert [(row["server"], row["running"]) for row in rows][-2:] in ([("a:1", 0), ("b:1", 0)],
                                                                      [("b:1", 0), ("a:1", 0)])


def test_the_file_is_closed_even_when_the_last_sample_fails(tmp_path):
    async def broken(request):
        raise RuntimeError("loop closing")

    watcher = MetricsScraper(servers=[endpoint("a:1")], send=broken, headers=httpx.Headers(), interval_s=1.0,
                             path=tmp_path / "m.jsonl", in_flight=lambda name: 0, log=logging.getLogger("w"),
                             shard_id=0)
    with pytest.raises(RuntimeError):
        asyncio.run(watcher.finish())
    assert watcher._out._fd == -1


def test_the_scraper_samples_then_waits_its_interval(tmp_path, monkeypatch):
    timeline = []
    watcher = scraper(tmp_path, [endpoint("a:1")], Pages(**{"a:1": metrics_page(1)}), interval_s=7.5)

    async def scrape_all():
        timeline.append("scrape")

    async def sleep(seconds):
        timeline.append(seconds)
        if len(timeline) >= 4:
            raise asyncio.CancelledError

    watcher.scrape_all = scrape_all
    monkeypatch.setattr(watch, "asyncio", SimpleNamespace(sleep=sleep, gather=asyncio.gather))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(watcher.run())
    assert timeline == ["scrape", 7.5, "scrape", 7.5]


def test_events_are_journalled_one_line_each_with_shard_time_and_fields(tmp_path):
    journal = EventJournal(tmp_path / "events" / "shard-00003.jsonl", 3)
    before = time.time()
    journal.record("down", "a:1", reason="refused", hung=False)
    journal.record("failed", "b:2", prompt="p0001")
    journal.close()
    journal.close()  # closing twice is harmless
    down, failed = read_jsonl(tmp_path / "events" / "shard-00003.jsonl")
    assert {k: down[k] for k in ("shard", "event", "server", "reason", "hung")} == {
        "shard": 3, "event": "down", "server": "a:1", "reason": "refused", "hung": False}
    assert list(down)[:5] == ["at", "t", "shard", "event", "server"]
    assert before - 0.01 <= down["t"] <= time.time() + 0.01 and down["t"] == round(down["t"], 3)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", down["at"])
    assert (failed["event"], failed["server"], failed["prompt"]) == ("failed", "b:2", "p0001")


@pytest.mark.parametrize("kind", ["down", "recovered", "retried", "failed"])
def test_every_documented_event_kind_is_accepted(tmp_path, kind):
    journal = EventJournal(tmp_path / "e.jsonl", 0)
    journal.record(kind, "a:1")
    journal.close()
    assert read_jsonl(tmp_path / "e.jsonl")[0]["event"] == kind


def test_an_unknown_event_kind_is_refused(tmp_path):
    journal = EventJournal(tmp_path / "e.jsonl", 0)
    with pytest.raises(ValueError, match=r"unknown server event 'up'; expected one of \('down', 'recovered'"):
        journal.record("up", "a:1")
    journal.close()
    assert (tmp_path / "e.jsonl").read_text() == ""


def test_an_appender_adds_to_what_an_earlier_try_wrote(tmp_path):
    path = tmp_path / "deep" / "er" / "x.jsonl"
    first = JsonlAppender(path)
    first.append({"n": 1})
    first.close()
    second = JsonlAppender(path)
    second.append({"n": 2, "ü": "é"})
    second.close()
    assert path.read_bytes() == b'{"n":1}\n' + '{"n":2,"ü":"é"}\n'.encode()
    assert oct(path.stat().st_mode & 0o777) == oct(0o644 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
