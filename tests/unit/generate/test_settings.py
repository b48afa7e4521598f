import json

import pytest

from fleetgen.errors import ConfigError
from fleetgen.generate import GenerationSettings, ServerEndpoint, server_limits


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
