"""The readiness event a trigger hands its task: each status read back as itself, with what it needs, and an event
from another fleetgen version refused naming the server, never a KeyError later in the operator."""

import json

import pytest

from fleetgen.airflow.readiness_event import ReadinessEvent, ReadinessStatus
from fleetgen.errors import FailureKind, ServerError

LAUNCHED = {"name": "gpu-node-1:30000", "node": "gpu-node-1", "gpu_ids": [0, 1], "pid": 4242,
            "log_path": "/tmp/fleetgen/sglang-30000.log"}
# What each status carries beside the common fields, as the trigger builds it.
EXTRA = {
    "ready": {"server_info": {"max_total_num_tokens": 1000}},
    "fatal": {"kind": "oom_kv", "fatal_line": "RuntimeError: Not enough memory for KV cache"},
    "timeout": {},
    "unreachable": {"error": "lost SSH to gpu-node-1", "budget": {"attempts": 8, "failures": 9}},
    "host_key_mismatch": {"error": "Host key is not trusted", "address": "10.0.0.7",
                          "expected": "ssh-ed25519 SHA256:aaa", "received": "ssh-ed25519 SHA256:bbb"},
    "ssh_credentials": {"error": "No such file or directory", "key_file": "/keys/id_ed25519"},
}
REQUIRED = {"ready": ["server_info"], "fatal": ["kind", "fatal_line"], "timeout": [], "unreachable": ["error"],
            "host_key_mismatch": ["error", "address", "expected", "received"], "ssh_credentials": ["error"]}


def _payload(event_status: str, **changes) -> dict:
    payload = {"status": event_status, "server": {"name": LAUNCHED["name"]}, "log_path": LAUNCHED["log_path"],
               "pid": 4242, "waited_s": 12.5, "context": {"launched": dict(LAUNCHED), "attempt": 2},
               "log_tail": ["loading"], **EXTRA[event_status]}
    return {**payload, **changes}


def _refusal(payload) -> ServerError:
    with pytest.raises(ServerError) as refused:
        ReadinessEvent.from_payload(payload)
    return refused.value


@pytest.mark.parametrize("status", list(EXTRA))
def test_each_status_is_read_back_as_itself_with_what_it_carries(status):
    event = ReadinessEvent.from_payload(json.loads(json.dumps(_payload(status))))
    assert event.status is ReadinessStatus(status)
    assert (event.log_path, event.pid, event.waited_s, event.log_tail) == (LAUNCHED["log_path"], 4242, 12.5,
                                                                           ["loading"])
    assert event.launched == LAUNCHED and event.attempt == 2
    for name, value in EXTRA[status].items():
        expected = FailureKind(value) if name == "kind" else value
        assert getattr(event, name) == expected


@pytest.mark.parametrize("status", list(EXTRA))
def test_the_payload_is_json_and_reads_back_equal(status):
    event = ReadinessEvent.from_payload(_payload(status))
    payload = event.payload()
    assert json.loads(json.dumps(payload)) == payload
    assert payload["status"] == status and type(payload["status"]) is str
    assert ReadinessEvent.from_payload(payload) == event


def test_the_payload_leaves_out_only_what_is_none():
    """A first poll (waited 0 s, an empty log) keeps its zero and its empty tail; the fields of other statuses go."""
    event = ReadinessEvent(status=ReadinessStatus.TIMEOUT, server={}, log_path="", pid=0, waited_s=0.0,
                           context={"launched": LAUNCHED, "attempt": 0})
    assert event.payload() == {"status": "timeout", "server": {}, "log_path": "", "pid": 0, "waited_s": 0.0,
                               "context": {"launched": LAUNCHED, "attempt": 0}, "log_tail": []}


def test_the_failure_kind_travels_as_its_value():
    payload = ReadinessEvent.from_payload(_payload("fatal", kind="oom_mamba")).payload()
    assert payload["kind"] == "oom_mamba" and type(payload["kind"]) is str


@pytest.mark.parametrize("status", [status for status in EXTRA if REQUIRED[status]])
def test_a_status_without_what_it_needs_is_refused_naming_every_missing_field(status):
    payload = {key: value for key, value in _payload(status).items() if key not in REQUIRED[status]}
    refused = _refusal(payload)
    assert refused.message == f"the readiness event ({status}) lacks {', '.join(REQUIRED[status])}"
    assert refused.server == LAUNCHED["name"] and "same fleetgen version" in refused.hint


@pytest.mark.parametrize("status, field", [(status, field) for status in EXTRA for field in REQUIRED[status]])
def test_each_required_field_alone_is_checked(status, field):
    payload = {key: value for key, value in _payload(status).items() if key != field}
    assert _refusal(payload).message == f"the readiness event ({status}) lacks {field}"


def test_a_timeout_needs_nothing_beyond_the_common_fields():
    event = ReadinessEvent(status=ReadinessStatus.TIMEOUT, server={"name": "s"}, log_path="/x", pid=1, waited_s=1.0,
                           context={})
    assert event.error is None and event.server_info is None and event.kind is None


def test_the_fields_a_status_does_not_need_are_not_asked_for():
    """A host-key mismatch never carries server_info, a ready event never an error: neither is refused."""
    assert ReadinessEvent.from_payload(_payload("host_key_mismatch")).server_info is None
    assert ReadinessEvent.from_payload(_payload("ready")).error is None


def test_an_event_built_without_a_server_name_is_refused_naming_an_unknown_server():
    with pytest.raises(ServerError) as refused:
        ReadinessEvent(status=ReadinessStatus.FATAL, server=None, log_path="/x", pid=1, waited_s=1.0, context={})
    assert refused.value.server == "?" and refused.value.message.endswith("lacks kind, fatal_line")
    with pytest.raises(ServerError) as refused:
        ReadinessEvent(status=ReadinessStatus.READY, server={}, log_path="/x", pid=1, waited_s=1.0, context={})
    assert refused.value.server == "?"


@pytest.mark.parametrize("broken, what", [
    ({"status": "starting"}, "ValueError: 'starting' is not a valid ReadinessStatus"),
    ({"kind": "oom_everything"}, "ValueError: 'oom_everything' is not a valid FailureKind"),
])
def test_an_unknown_status_or_kind_is_refused_naming_the_server(broken, what):
    refused = _refusal(_payload("fatal", **broken))
    assert refused.message == f"wait_ready got a readiness event it cannot read ({what})"
    assert refused.server == LAUNCHED["name"] and "same fleetgen version" in refused.hint


def test_an_event_without_a_status_is_refused_as_a_missing_key():
    payload = {key: value for key, value in _payload("ready").items() if key != "status"}
    refused = _refusal(payload)
    assert refused.message == "wait_ready got a readiness event it cannot read (KeyError: 'status')"
    assert refused.server == LAUNCHED["name"]


def test_an_event_without_a_common_field_is_refused_as_a_type_error():
    payload = {key: value for key, value in _payload("ready").items() if key != "pid"}
    refused = _refusal(payload)
    assert refused.message.startswith("wait_ready got a readiness event it cannot read (TypeError: ")
    assert "pid" in refused.message and refused.server == LAUNCHED["name"]


@pytest.mark.parametrize("payload", [None, ["ready"], "ready"])
def test_something_that_is_not_an_event_is_refused_with_an_unknown_server(payload):
    refused = _refusal(payload)
    assert refused.server == "?" and refused.message.startswith("wait_ready got a readiness event it cannot read (")


@pytest.mark.parametrize("server", [None, {}, {"port": 30000}])
def test_an_unreadable_event_without_a_server_name_names_an_unknown_server(server):
    assert _refusal(_payload("fatal", server=server, status="starting")).server == "?"


def test_a_field_added_by_a_newer_version_is_ignored():
    event = ReadinessEvent.from_payload(_payload("ready", gpu_temperature_c=71))
    assert event.status is ReadinessStatus.READY and not hasattr(event, "gpu_temperature_c")


def test_a_kind_left_out_or_null_is_no_kind():
    assert ReadinessEvent.from_payload(_payload("timeout", kind=None)).kind is None
    assert ReadinessEvent.from_payload(_payload("timeout")).kind is None


@pytest.mark.parametrize("key", list(LAUNCHED))
def test_a_launch_record_missing_any_key_the_operator_reads_is_refused(key):
    launched = {name: value for name, value in LAUNCHED.items() if name != key}
    refused = _refusal(_payload("ready", context={"launched": launched, "attempt": 0}))
    assert refused.message == "the readiness event (ready) lacks context.launched, context.attempt"
    assert refused.server == LAUNCHED["name"]


@pytest.mark.parametrize("context", [
    None, [], {"attempt": 0}, {"launched": None, "attempt": 0}, {"launched": LAUNCHED},
    {"launched": LAUNCHED, "attempt": True},   # JSON true where the attempt count is expected
    {"launched": LAUNCHED, "attempt": False},
    {"launched": LAUNCHED, "attempt": 1.0}, {"launched": LAUNCHED, "attempt": "1"},
])
def test_a_context_the_operator_cannot_resume_from_is_refused(context):
    refused = _refusal(_payload("fatal", context=context))
    assert refused.message == "the readiness event (fatal) lacks context.launched, context.attempt"


def test_the_first_attempt_zero_is_a_valid_attempt():
    event = ReadinessEvent.from_payload(_payload("fatal", context={"launched": LAUNCHED, "attempt": 0}))
    assert event.attempt == 0 and event.launched["pid"] == 4242


def test_a_launch_record_with_more_than_the_operator_reads_is_kept_whole():
    launched = {**LAUNCHED, "plan": {"attempt": 1}, "ssh_conn_id": "gpu-node-1"}
    event = ReadinessEvent.from_payload(_payload("ready", context={"launched": launched, "attempt": 1}))
    assert event.launched == launched
