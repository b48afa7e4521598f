import json
import re

import pytest

from fleetgen.errors import ConfigError
from fleetgen.generate import GenerationSettings, ServerEndpoint, server_limits, shard_endpoints


def test_limits_follow_each_servers_readback_not_a_global_concurrency():
    # The worked case: 7 servers capped at 40; three shards at once share each server's 40 x 1.25.
    limits = server_limits({f"n:{30000 + i}": 40 for i in range(7)}, headroom=1.25, parallel_shards=3)
    assert set(limits.values()) == {17}
    assert 3 * 17 - 50 < 3  # together: the limit plus headroom, overshooting by less than one per shard


@pytest.mark.parametrize("mrr, headroom, shards, expected", [
    (16, 1.25, 1, 20),
    (4, 1.25, 1, 5),
    (1, 1.25, 1, 2),  # at least one queued behind the running one
    (40, 1.0, 1, 40),
    (40, 1.25, 4, 13),
    (3, 1.25, 8, 1),
])
def test_server_limits(mrr, headroom, shards, expected):
    assert server_limits({"s": mrr}, headroom=headroom, parallel_shards=shards) == {"s": expected}


def test_server_limits_reject_bad_inputs():
    with pytest.raises(ConfigError, match="headroom"):
        server_limits({"s": 4}, headroom=0.9, parallel_shards=1)
    with pytest.raises(ConfigError, match="parallel_shards"):
        server_limits({"s": 4}, headroom=1.25, parallel_shards=0)
    with pytest.raises(ConfigError) as caught:
        server_limits({"h:1": 0}, headroom=1.25, parallel_shards=1)
    assert caught.value.server == "h:1"


def test_endpoint_validates_and_round_trips():
    endpoint = ServerEndpoint(name="h:30000", url="http://h:30000/", max_in_flight=17, host="h", gpu_ids=[0])
    assert endpoint.url == "http://h:30000" and endpoint.gpu_ids == (0,)
    assert ServerEndpoint.from_dict(json.loads(json.dumps(endpoint.to_dict()))) == endpoint
    with pytest.raises(ConfigError, match="not http"):
        ServerEndpoint(name="h:1", url="h:1", max_in_flight=1)
    with pytest.raises(ConfigError, match="max_in_flight"):
        ServerEndpoint(name="h:1", url="http://h:1", max_in_flight=0)


def test_settings_validate_round_trip_and_size_the_timeout():
    settings = GenerationSettings(model="qwen", max_tokens=4096,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    # Two 4K generations at 10 tok/s per request plus a margin: queued behind a full batch.
    assert settings.effective_request_timeout_s == pytest.approx(2 * 4096 / 10 + 60)
    assert GenerationSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
    assert settings.sampling({"temperature": 0.0}) == {"max_tokens": 4096, "temperature": 0.0, "top_p": 0.95}
    with pytest.raises(ConfigError) as caught:
        GenerationSettings(model="", max_tokens=0, top_p=2.0)
    for expected in ("model is empty", "max_tokens", "top_p"):
        assert expected in str(caught.value)
    with pytest.raises(ConfigError, match="unknown generation settings: max_token"):
        GenerationSettings.from_dict({"model": "m", "max_token": 5})


# --- a server endpoint ------------------------------------------------------------------------------------

def test_an_endpoint_without_a_name_is_refused():
    with pytest.raises(ConfigError) as caught:
        ServerEndpoint(name="", url="http://h:1", max_in_flight=1)
    assert caught.value.message == "a server endpoint needs a name"
    assert caught.value.hint == 'use "host:port"'


@pytest.mark.parametrize("url", ["http://h:1", "https://h:1", "http://10.0.0.2:30000/"])
def test_http_and_https_urls_are_taken(url):
    assert ServerEndpoint(name="h:1", url=url, max_in_flight=1).url == url.rstrip("/")


@pytest.mark.parametrize("url", ["ftp://h:1", "h:1", "http://:1", "http:///v1", ""])
def test_a_url_that_is_not_http_host_port_is_refused_naming_the_server(url):
    with pytest.raises(ConfigError, match=re.escape(f"server url {url!r} is not http(s)://host:port")) as caught:
        ServerEndpoint(name="h:1", url=url, max_in_flight=1)
    assert caught.value.server == "h:1"
    assert caught.value.hint == "pass the base URL the server listens on, without a path"


@pytest.mark.parametrize("limit", [0, -3, True, False, 2.0, "4", None])
def test_max_in_flight_must_be_a_positive_integer_and_json_true_is_not_one(limit):
    with pytest.raises(ConfigError, match=re.escape(f"max_in_flight must be a positive integer, got {limit!r}")) as caught:
        ServerEndpoint(name="h:1", url="http://h:1", max_in_flight=limit)
    assert caught.value.server == "h:1"
    assert caught.value.hint == "derive it with server_limits() from the readiness readback"


def test_a_single_request_in_flight_is_a_limit():
    assert ServerEndpoint(name="h:1", url="http://h:1", max_in_flight=1).max_in_flight == 1


def test_only_trailing_slashes_leave_the_url():
    endpoint = ServerEndpoint(name="h:1", url="http://h:1//", max_in_flight=1)
    assert endpoint.url == "http://h:1"
    assert ServerEndpoint(name="h:1", url="http://h:1/baseX", max_in_flight=1).url == "http://h:1/baseX"


def test_an_endpoint_defaults_to_no_host_no_gpus_and_no_known_cap():
    endpoint = ServerEndpoint(name="h:1", url="http://h:1", max_in_flight=3)
    assert (endpoint.host, endpoint.gpu_ids, endpoint.effective_max_running_requests) == ("", (), 0)


def test_an_endpoint_dict_is_json_with_gpu_ids_as_a_list_and_unknown_keys_are_ignored_on_reading():
    endpoint = ServerEndpoint(name="h:1", url="http://h:1", max_in_flight=3, host="h", gpu_ids=(0, 1),
                              effective_max_running_requests=40, launch_id="fleetgen/r1")
    data = endpoint.to_dict()
    assert data == {"name": "h:1", "url": "http://h:1", "max_in_flight": 3, "host": "h", "gpu_ids": [0, 1],
                    "effective_max_running_requests": 40, "launch_id": "fleetgen/r1", "launch_fields": {}}
    assert ServerEndpoint.from_dict({**data, "added_later": 1}) == endpoint


# --- generation settings ----------------------------------------------------------------------------------

def test_the_defaults_of_a_run():
    settings = GenerationSettings(model="m", max_tokens=8)
    assert (settings.temperature, settings.top_p, settings.extra_body, settings.request_timeout_s) == (0.6, 0.95, {},
                                                                                                         None)
    assert (settings.connect_timeout_s, settings.max_attempts, settings.retry_backoff_s) == (10.0, 5, 0.5)
    assert (settings.recheck_initial_s, settings.recheck_max_s, settings.health_timeout_s) == (1.0, 30.0, 5.0)
    assert (settings.stall_check_s, settings.all_down_timeout_s, settings.client_error_breaker) == (4.0, 120.0, 20)
    assert (settings.lease_wait_s, settings.share_server_health, settings.sample_interval_s) == (60.0, True, 5.0)


@pytest.mark.parametrize("overrides, problem", [
    ({"max_tokens": True}, "max_tokens must be a positive integer, got True"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer, got 0"),
    ({"max_tokens": 64.0}, "max_tokens must be a positive integer, got 64.0"),
    ({"temperature": -0.1}, "temperature must be >= 0, got -0.1"),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    ({"top_p": 1.01}, "top_p must be in (0, 1], got 1.01"),
    ({"extra_body": []}, "extra_body must be a dict"),
    ({"request_timeout_s": 0}, "request_timeout_s must be > 0, got 0"),
    ({"max_attempts": 0}, "max_attempts and client_error_breaker must be positive integers"),
    ({"max_attempts": True}, "max_attempts and client_error_breaker must be positive integers"),
    ({"client_error_breaker": 0}, "max_attempts and client_error_breaker must be positive integers"),
    ({"client_error_breaker": False}, "max_attempts and client_error_breaker must be positive integers"),
    ({"sample_interval_s": -1.0}, "sample_interval_s must be >= 0, got -1.0"),
    *[({name: 0}, f"{name} must be > 0, got 0") for name in (
        "connect_timeout_s", "retry_backoff_s", "recheck_initial_s", "recheck_max_s", "health_timeout_s",
        "all_down_timeout_s", "stall_check_s", "lease_wait_s")],
])
def test_each_invalid_setting_is_named(overrides, problem):
    with pytest.raises(ConfigError, match=re.escape(f"invalid generation settings: {problem}")) as caught:
        GenerationSettings(**{"model": "m", "max_tokens": 8, **overrides})
    assert str(caught.value).split("\n")[0] == f"invalid generation settings: {problem}"
    assert caught.value.hint == "check the generation parameters of the run"


def test_every_problem_is_named_at_once():
    with pytest.raises(ConfigError) as caught:
        GenerationSettings(model="", max_tokens=0, temperature=-1.0)
    assert caught.value.message == ("invalid generation settings: model is empty; max_tokens must be a positive "
                                    "integer, got 0; temperature must be >= 0, got -1.0")


def test_the_edges_of_each_range_are_allowed():
    settings = GenerationSettings(model="m", max_tokens=1, temperature=0.0, top_p=1.0, max_attempts=1,
                                  client_error_breaker=1, sample_interval_s=0.0, request_timeout_s=0.5)
    assert (settings.max_tokens, settings.top_p, settings.sample_interval_s) == (1, 1.0, 0.0)


def test_a_set_request_timeout_is_used_as_it_is():
    assert GenerationSettings(model="m", max_tokens=4096, request_timeout_s=30.0).effective_request_timeout_s == 30.0


def test_the_sized_request_timeout_follows_max_tokens():
    assert GenerationSettings(model="m", max_tokens=100).effective_request_timeout_s == pytest.approx(80.0)
    assert GenerationSettings(model="m", max_tokens=1000).effective_request_timeout_s == pytest.approx(260.0)


def test_sampling_is_the_runs_without_overrides_and_a_prompts_override_does_not_stick():
    settings = GenerationSettings(model="m", max_tokens=64, temperature=0.5, top_p=0.8)
    assert settings.sampling() == {"max_tokens": 64, "temperature": 0.5, "top_p": 0.8}
    assert settings.sampling({}) == {"max_tokens": 64, "temperature": 0.5, "top_p": 0.8}
    assert settings.sampling({"max_tokens": 2048, "seed": 3}) == {"max_tokens": 2048, "temperature": 0.5, "top_p": 0.8,
                                                                  "seed": 3}
    assert settings.sampling(None)["max_tokens"] == 64


def test_settings_from_json_reject_every_unknown_name_sorted_and_list_the_known_ones():
    with pytest.raises(ConfigError) as caught:
        GenerationSettings.from_dict({"model": "m", "max_tokens": 5, "zeta": 1, "alpha": 2})
    assert caught.value.message == "unknown generation settings: alpha, zeta"
    assert caught.value.hint.startswith("known settings: all_down_timeout_s, client_error_breaker, ")
    assert "max_tokens, model, " in caught.value.hint


def test_settings_from_json_with_true_for_max_tokens_are_refused():
    with pytest.raises(ConfigError, match="max_tokens must be a positive integer, got True"):
        GenerationSettings.from_dict(json.loads('{"model": "m", "max_tokens": true}'))


# --- each shard's share of each server ---------------------------------------------------------------------

def test_several_servers_with_different_caps_each_get_their_own_limit():
    assert server_limits({"a:1": 40, "b:1": 8, "c:1": 1}, headroom=1.25, parallel_shards=2) == {
        "a:1": 25, "b:1": 5, "c:1": 1}


def test_a_headroom_of_exactly_one_adds_no_queue_and_just_under_one_is_refused():
    assert server_limits({"s": 7}, headroom=1.0, parallel_shards=2) == {"s": 4}
    with pytest.raises(ConfigError, match=re.escape("headroom must be >= 1.0, got 0.99")) as caught:
        server_limits({"s": 7}, headroom=0.99, parallel_shards=1)
    assert caught.value.hint == "use e.g. 1.25 (25 % queued)"


def test_the_smallest_headroom_over_one_still_queues_one_request():
    assert server_limits({"s": 10}, headroom=1.01, parallel_shards=1) == {"s": 11}
    assert server_limits({"s": 10}, headroom=1.5, parallel_shards=1) == {"s": 15}


@pytest.mark.parametrize("shards", [0, -1, True, 2.0])
def test_parallel_shards_must_be_a_positive_integer(shards):
    with pytest.raises(ConfigError, match=re.escape(f"parallel_shards must be a positive integer, got {shards!r}")):
        server_limits({"s": 4}, headroom=1.25, parallel_shards=shards)
    with pytest.raises(ConfigError) as caught:
        server_limits({"s": 4}, headroom=1.25, parallel_shards=0)
    assert caught.value.hint == "pass the number of generate_shard tasks that run at once"


@pytest.mark.parametrize("mrr", [0, True, 40.0, "40", None])
def test_a_readback_cap_that_is_not_a_positive_integer_names_its_server(mrr):
    with pytest.raises(ConfigError, match=re.escape(f"must be a positive integer, got {mrr!r}")) as caught:
        server_limits({"ok:1": 40, "bad:2": mrr}, headroom=1.25, parallel_shards=1)
    assert caught.value.server == "bad:2"
    assert caught.value.hint == "check the /server_info readback of this server"


READINESS = [
    {"server": "n1:30000", "url": "http://n1:30000", "host": "n1", "gpu_ids": [0, 1],
     "effective_max_running_requests": 40},
    {"server": "n2:30000", "url": "http://n2:30000", "host": "n2", "gpu_ids": [0],
     "effective_max_running_requests": 8},
]


def test_shard_endpoints_carry_each_servers_own_share_host_gpus_and_cap():
    endpoints = shard_endpoints(READINESS, headroom=1.25, parallel_shards=2)
    assert endpoints == [
        ServerEndpoint(name="n1:30000", url="http://n1:30000", max_in_flight=25, host="n1", gpu_ids=(0, 1),
                       effective_max_running_requests=40),
        ServerEndpoint(name="n2:30000", url="http://n2:30000", max_in_flight=5, host="n2", gpu_ids=(0,),
                       effective_max_running_requests=8)]


def test_shard_endpoints_shared_automatically_start_with_the_whole_limit():
    endpoints = shard_endpoints(READINESS, headroom=1.25, parallel_shards=0)
    assert [endpoint.max_in_flight for endpoint in endpoints] == [50, 10]
