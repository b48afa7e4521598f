"""The simulator answers, counts and logs as the real SGLang 0.5.23 server does, for everything the product reads.

Each probe (tests/real_sglang/probes.py) runs once against a real server on this CPU and once against a simulated
server launched with the same model folder and flags; the tests compare what came back, with the real server's
answer as the reference: status codes, JSON keys and types, metric names, types and labels, log lines. The last
test of each kind stops both servers with SIGTERM, as the product's stop does, and compares the drain.

``test_the_suite_covers_every_*`` collect what the product reads from SGLang (its routes, ``/server_info`` keys,
response fields, metric names, log needles and launch flags) out of its source, and fail when it reads something
the inventories below, which the other tests check on both servers, do not hold.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetgen.generate.chat import error_message, parse_chat_response
from fleetgen.generate.server_metrics import parse_metrics
from fleetgen.nodes import readiness, remote
from fleetgen.tuning.calibration import LOAD_BEGIN_MARK, pre_load_from_log
from tests.real_sglang import probes
from tests.real_sglang import server as real
from tests.real_sglang.server import require_real_sglang

PRODUCT = Path(__file__).resolve().parents[2] / "include" / "fleetgen"
SGLANG = real.VENV / "lib" / "python3.11" / "site-packages" / "sglang"
KINDS = ("dense", "hybrid")

# ---- what the product reads, which the tests below check on both servers ---------------------------------------

# Every route the product calls; capture() probes each (the chat route in all its forms).
ROUTES = {"/health", "/health_generate", "/ready", "/model_info", "/server_info", "/get_server_info", "/v1/models",
          "/v1/loads", "/metrics", "/v1/chat/completions"}
# /server_info keys read by nodes/readiness.py parse_server_info: (where, key). "sim" is the simulator's own
# capacity model, which the product reads only to mark a report as simulated.
SERVER_INFO_READ = {("$", "internal_states"), ("$", "max_total_num_tokens"), ("$", "context_length"),
                    ("$", "version"), ("$.internal_states[]", "effective_max_running_requests_per_dp"),
                    ("$.internal_states[]", "max_total_num_tokens"), ("$.internal_states[]", "max_mamba_cache_size"),
                    ("$.internal_states[]", "context_length"), ("$.internal_states[]", "memory_usage"),
                    ("$.internal_states[].memory_usage", "token_capacity_swa")}
SIMULATOR_ONLY_READ = {("$.internal_states[]", "sim")}
# Chat completion fields the client reads (generate/chat.py, dispatch.py, records.py), and error fields.
CHAT_READ = {"choices", "message", "content", "reasoning_content", "finish_reason", "usage", "model",
             "prompt_tokens", "completion_tokens", "metadata", "weight_version"}
ERROR_READ = {"error", "message", "detail"}
# /metrics names the product reads (generate/server_metrics.py).
METRICS_READ = {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                "sglang:spec_accept_length", "sglang:mamba_usage", "sglang:generation_tokens_total",
                "sglang:num_requests_total"}
# Log needles: module-level constants of the log-reading modules, by module and name.
LOG_NEEDLES = {("tuning/calibration.py", "LOAD_BEGIN_MARK"), ("tuning/calibration.py", "_LOAD_BEGIN"),
               ("nodes/remote.py", "_FULL_TOKEN"), ("nodes/remote.py", "_TOKEN"), ("nodes/remote.py", "_RETRACTED")}
# Constants of those modules that are no SGLang log text.
NOT_LOG_TEXT = {("tuning/calibration.py", "PLANNED_SGLANG_VERSION"), ("nodes/remote.py", "SECTION_MARKER"),
                ("nodes/remote.py", "ALIVE_MARK"), ("nodes/remote.py", "_ENV_NAME"),
                ("nodes/readiness.py", "_EXCEPTION_LINE"), ("nodes/remote.py", "_MODEL_IDENTITY_PROGRAM"),
                ("nodes/readiness.py", "LAUNCH_FIELDS"), ("nodes/remote.py", "SERVER_MARKER_ENV")}
# The fatal-line tables of readiness.py: none may match a healthy server's log (test_a_healthy_log_...).
FATAL_TABLES = {("nodes/readiness.py", "_SPECIFIC"), ("nodes/readiness.py", "_GENERIC")}
LOG_READING_MODULES = ("tuning/calibration.py", "nodes/remote.py", "nodes/readiness.py", "airflow/triggers.py",
                       "tuning/workload_history.py")
# Flags no /server_info reports, which the product never compares: --config and the API key it carries are read by
# SGLang's config-file parser (nodes/remote.py launch_command adds them outside the compared argv).
UNCOMPARED_FLAGS = {"--config", "--api-key"}

# Where the CPU server and the simulated GPU server differ by their device alone.
CPU_ONLY_TYPES = {
    # the GPU's name; null without one (sglang/srt/entrypoints/v1_loads.py _accelerator_name)
    "$.accelerator",
}


# ---- servers and their answers -----------------------------------------------------------------------------------

@dataclass
class Pair:
    kind: str
    real: real.RealServer
    sim: probes.SimServer
    real_replies: dict
    sim_replies: dict


def _real_server(request, kind: str) -> real.RealServer:
    name = f"real_{kind}_server"
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        pytest.skip(f"tests/real_sglang/conftest.py has no {name} fixture: the {kind} real server cannot run yet")


def _sim_server(request, tmp_path_factory, kind: str):
    reference = _real_server(request, kind)
    from devstack.demo import free_port_block

    with probes.SimServer(model_dir=reference.model_dir, port=free_port_block(1),
                          root=tmp_path_factory.mktemp(f"sim-{kind}"), flags=tuple(probes.sim_flags(reference))) as sim:
        yield sim


@pytest.fixture(scope="session")
def sim_dense_server(request, tmp_path_factory):
    """The simulated twin of real_dense_server: its model folder and flags, on a simulated GPU node."""
    yield from _sim_server(request, tmp_path_factory, "dense")


@pytest.fixture(scope="session")
def sim_hybrid_server(request, tmp_path_factory):
    """The simulated twin of real_hybrid_server."""
    yield from _sim_server(request, tmp_path_factory, "hybrid")


@pytest.fixture(scope="session")
def replies_cache() -> dict:
    return {}


@pytest.fixture(scope="session", params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def pair(request, kind, replies_cache) -> Pair:
    real_server = _real_server(request, kind)
    sim = request.getfixturevalue(f"sim_{kind}_server")
    for server in (real_server, sim):
        if server.url not in replies_cache:
            replies_cache[server.url] = probes.capture(server.url)
    return Pair(kind, real_server, sim, replies_cache[real_server.url], replies_cache[sim.url])


def _both(pair: Pair, name: str):
    return pair.real_replies[name], pair.sim_replies[name]


# ---- HTTP --------------------------------------------------------------------------------------------------------

# What the real server answers each probe with (capture() in probes.py).
EXPECTED_STATUS = {"/health": 200, "/health_generate": 200, "/ready": 200, "/model_info": 200, "/server_info": 200,
                   "/get_server_info": 200, "/v1/models": 200, "/v1/loads": 200, "/metrics": 200,
                   "/no_such_route": 404, "chat": 200, "chat_stream": 200, "chat_stream_usage": 200,
                   "chat_prompt_too_long": 400, "chat_budget_too_long": 400, "/metrics after": 200,
                   "/server_info after": 200, "/v1/loads after": 200}


def test_every_probe_gets_the_real_servers_status_code(pair):
    real_codes = {name: reply.status for name, reply in pair.real_replies.items()}
    sim_codes = {name: reply.status for name, reply in pair.sim_replies.items()}
    assert real_codes == EXPECTED_STATUS
    assert sim_codes == real_codes


def test_health_is_503_until_warm_then_200_with_an_empty_body(pair):
    # the real server opens its port before the warm-up request and answers 503 until it is done
    assert pair.real.health_codes[-1] == 200 and 503 in pair.real.health_codes
    for codes in (pair.real.health_codes, pair.sim.health_codes):
        assert set(codes[:-1]) <= {503} and codes[-1] == 200
    for name in ("/health", "/health_generate", "/ready"):
        real_reply, sim_reply = _both(pair, name)
        assert real_reply.body == sim_reply.body == b""
        assert real_reply.headers.get("content-length") == sim_reply.headers.get("content-length") == "0"


@pytest.mark.parametrize("name", ["/model_info", "/v1/models", "/v1/loads after", "chat", "chat_prompt_too_long",
                                  "chat_budget_too_long", "/no_such_route"])
def test_json_answers_have_the_real_servers_keys_and_types(pair, name):
    real_reply, sim_reply = _both(pair, name)
    assert real_reply.headers["content-type"] == sim_reply.headers["content-type"] == "application/json"
    assert probes.shape_differences(real_reply.json, sim_reply.json, type_ok=frozenset(CPU_ONLY_TYPES)) == []


def test_loads_before_any_request_have_the_real_servers_keys(pair):
    # decode_moments is null until a decode step has run (sglang/srt/managers/scheduler_components/
    # load_inquirer.py), which on each server depends on its own warm-up
    real_reply, sim_reply = _both(pair, "/v1/loads")
    assert probes.shape_differences(real_reply.json, sim_reply.json, type_ok=frozenset(
        CPU_ONLY_TYPES | {"$.loads[].decode_moments"})) == []


@pytest.mark.parametrize("name", ["chat_stream", "chat_stream_usage"])
def test_chat_streams_send_the_real_servers_chunks(pair, name):
    real_events, sim_events = (reply.events for reply in _both(pair, name))
    kinds = probes.chunk_kinds(real_events)
    # role, text, the finish, then the usage only when asked for (stream_options.include_usage), then [DONE]
    assert kinds == ["role", "content", "finish"] + (["usage"] if name.endswith("usage") else []) + ["done"]
    assert probes.chunk_kinds(sim_events) == kinds
    for kind in kinds[:-1]:
        assert probes.shape_differences(probes.chunk_of_kind(real_events, kind),
                                        probes.chunk_of_kind(sim_events, kind)) == [], kind
    for reply in _both(pair, name):
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"


def _server_info_parts(info: dict) -> tuple[dict, dict, dict, dict]:
    """(top-level argument fields, top-level other keys, rank 0's argument fields, rank 0's other keys) of a real
    server's /server_info: the resolved ServerArgs appear at both levels, the rest at one."""
    state = info["internal_states"][0]
    top_other = {key for key in info if key not in state} | {"startup_time", "internal_states"}
    state_other = {key for key in state if key not in info} | {"startup_time"}
    return ({k: v for k, v in info.items() if k not in top_other}, {k: info[k] for k in top_other},
            {k: v for k, v in state.items() if k not in state_other}, {k: state[k] for k in state_other})


def test_server_info_has_the_real_servers_scheduler_keys(pair):
    real_info, sim_info = (reply.json for reply in _both(pair, "/server_info after"))
    _, real_top, _, real_state = _server_info_parts(real_info)
    sim_top = {key: sim_info.get(key, "<missing>") for key in real_top if key != "internal_states"}
    sim_state = {key: sim_info["internal_states"][0].get(key, "<missing>") for key in real_state}
    real_top.pop("internal_states")
    assert len(sim_info["internal_states"]) == len(real_info["internal_states"])
    assert probes.shape_differences(real_top, sim_top) == []
    assert probes.shape_differences(real_state, sim_state) == []


def test_every_argument_the_simulator_reports_is_the_real_servers(pair):
    """The simulator reports the arguments it models (the real server all of ServerArgs'): each one must be a
    field of the real server's, of the same JSON type, at the same level."""
    real_info, sim_info = (reply.json for reply in _both(pair, "/server_info after"))
    real_args, _, real_state_args, _ = _server_info_parts(real_info)
    sim_state = dict(sim_info["internal_states"][0])
    sim_state.pop("sim")  # the simulator's own figures (readiness.py reads it to mark a report simulated)
    for where, real_fields, sim_fields in (("$", real_args, sim_info), ("$.internal_states[]", real_state_args,
                                                                        sim_state)):
        extra = sorted(key for key in sim_fields if key not in real_fields and key not in real_info
                       and key not in real_info["internal_states"][0])
        assert extra == [], f"{where}: the real server has no {extra}"
        common = {key: sim_fields[key] for key in sim_fields if key in real_fields}
        assert probes.shape_differences(real_fields, common, where, subset=True) == []


def test_the_product_reads_the_same_limits_from_both_servers(pair):
    real_info, sim_info = (reply.json for reply in _both(pair, "/server_info after"))
    def scope(info: dict, where: str) -> dict:
        return {"$": info, "$.internal_states[]": info["internal_states"][0],
                "$.internal_states[].memory_usage": info["internal_states"][0].get("memory_usage") or {}}[where]

    for where, key in SERVER_INFO_READ:
        real_scope, sim_scope = scope(real_info, where), scope(sim_info, where)
        # null where the product expects a number matters: compare presence and JSON type
        assert (key in real_scope, probes.json_type(real_scope.get(key))) == \
            (key in sim_scope, probes.json_type(sim_scope.get(key))), f"{where}.{key}"
    real_limits = readiness.parse_server_info(real_info, server="real").to_dict()
    sim_limits = readiness.parse_server_info(sim_info, server="sim").to_dict()
    assert sim_limits.pop("simulated") is True and "simulated" not in real_limits
    assert sim_limits == real_limits  # same model, same flags: the same effective limits


def test_both_servers_report_the_launch_a_shard_re_reads_alike(pair):
    """generate/launch_check.py compares nodes/readiness.py launch_fields of a fresh /server_info with wait_ready's:
    the model path, the launch identity (--weight-version, SGLang's "default" without it) and each launch flag's
    field. Both servers report each of them alike, and every completion names the identity /server_info reports."""
    real_info, sim_info = (reply.json for reply in _both(pair, "/server_info after"))
    flags = readiness.args_as_flags(probes.sim_flags(pair.real))
    real_fields, sim_fields = (readiness.launch_fields(info, flags) for info in (real_info, sim_info))
    assert [name for name, value in real_fields.items() if value is None] == []
    assert {name: probes.json_type(value) for name, value in sim_fields.items()} == \
        {name: probes.json_type(value) for name, value in real_fields.items()}
    assert real_fields["weight_version"] == sim_fields["weight_version"] == "default"
    for reply, info in zip(_both(pair, "chat"), (real_info, sim_info)):
        assert parse_chat_response(reply.body).weight_version == info["weight_version"]


def test_chat_answers_read_by_the_product_alike(pair):
    real_chat, sim_chat = (parse_chat_response(reply.body) for reply in _both(pair, "chat"))
    assert {real_chat.finish_reason, sim_chat.finish_reason} <= {"stop", "length"}
    assert set(real_chat.usage) == set(sim_chat.usage)
    assert real_chat.model == sim_chat.model == pair.real_replies["/v1/models"].json["data"][0]["id"]
    for name in ("chat_prompt_too_long", "chat_budget_too_long", "/no_such_route"):
        real_message, sim_message = (error_message(reply.body) for reply in _both(pair, name))
        assert probes.template(real_message) == probes.template(sim_message), name


def test_the_products_transport_reads_both_servers(pair):
    """Two chats on one keep-alive connection and a 400, through the shard's own HTTP client."""
    import httpx

    from fleetgen.generate.transport import PooledTransport

    async def exchange(url: str, model: str) -> list[httpx.Response]:
        transport = PooledTransport()
        responses = []
        for body in (probes.chat_body(model), probes.chat_body(model), probes.chat_body(model, max_tokens=10**6)):
            request = httpx.Request("POST", url + "/v1/chat/completions", json=body,
                                    extensions={"timeout": {"connect": 10.0, "read": 120.0}})
            response = await transport.handle_async_request(request)
            await response.aread()
            responses.append(response)
        await transport.aclose()
        return responses

    model = pair.real_replies["/v1/models"].json["data"][0]["id"]
    for server in (pair.real, pair.sim):
        first, second, refused = asyncio.run(exchange(server.url, model))
        assert (first.status_code, second.status_code, refused.status_code) == (200, 200, 400), server.url
        assert parse_chat_response(second.content).usage["completion_tokens"] > 0
        assert "context length" in error_message(refused.content)


# ---- /metrics ----------------------------------------------------------------------------------------------------

def _declared_metrics() -> dict[str, str]:
    """Every sglang: metric SGLang 0.5.23 declares, with its type (sglang/srt/observability/metrics_collector.py)."""
    source = (SGLANG / "srt" / "observability" / "metrics_collector.py").read_text()
    return {name: kind.lower() for kind, name in re.findall(
        r'=\s*(Gauge|Counter|Histogram)\(\s*(?:#[^\n]*\n\s*)*name="(sglang:[^"]+)"', source)}


def test_metrics_the_product_reads_have_the_real_servers_type_and_labels(pair):
    real_page, sim_page = (reply.body.decode() for reply in _both(pair, "/metrics after"))
    real_families, sim_families = probes.metric_families(real_page), probes.metric_families(sim_page)
    for name in METRICS_READ:
        assert name in real_families and sim_families.get(name) == real_families[name], name
    real_sample, sim_sample = (parse_metrics(page, server=pair.kind) for page in (real_page, sim_page))
    assert {k for k, v in vars(real_sample).items() if v is None} == {k for k, v in vars(sim_sample).items()
                                                                       if v is None}


def test_every_metric_the_simulator_serves_is_the_real_servers(pair):
    real_families = probes.metric_families(pair.real_replies["/metrics after"].body.decode())
    sim_families = probes.metric_families(pair.sim_replies["/metrics after"].body.decode())
    assert pair.sim_replies["/metrics after"].headers["content-type"] == \
        pair.real_replies["/metrics after"].headers["content-type"]
    for name, family in sim_families.items():
        assert real_families.get(name) == family, name
    # the retraction counters appear with the first retraction, on both (prometheus_client's labelled counters)
    declared = _declared_metrics()
    for name in ("sglang:num_retracted_requests_total", "sglang:num_retracted_input_tokens_total",
                 "sglang:num_retracted_output_tokens_total"):
        assert declared[name] == "counter" and name not in real_families and name not in sim_families


# ---- log lines ---------------------------------------------------------------------------------------------------

def _logs(pair: Pair) -> tuple[str, str]:
    return pair.real.log_text(), pair.sim.log_text()


def test_start_up_lines_the_product_reads_are_the_real_servers(pair):
    real_log, sim_log = _logs(pair)
    assert pre_load_from_log(real_log) is not None and pre_load_from_log(sim_log) is not None
    assert LOAD_BEGIN_MARK in probes.first_message(real_log, "Load weight begin")
    starts = ["Load weight begin", "Load weight end", "KV Cache is allocated", "Memory pool end"]
    starts += ["Mamba Cache is allocated"] if pair.kind == "hybrid" else []
    for start in starts:
        assert probes.template(probes.first_message(real_log, start)) == \
            probes.template(probes.first_message(sim_log, start)), start
    # the sizes line names the device's memory: available_cpu_mem on this CPU, available_gpu_mem on a GPU
    sizes = [re.sub(r"available_(?:cpu|gpu)_mem", "available_mem", probes.template(
        probes.first_message(log, "max_total_num_tokens="))) for log in (real_log, sim_log)]
    assert sizes[0] == sizes[1]
    for log in (real_log, sim_log):
        assert "The server is fired up and ready to roll!" in probes.log_messages(log)
        assert probes.log_prefixes(log) == {""}  # one GPU: no DP/TP rank on the scheduler's lines


@pytest.mark.parametrize("start", ["Decode batch", "Prefill batch"])
def test_batch_lines_have_the_real_servers_fields(pair, start):
    real_line, sim_line = (probes.template(probes.first_message(log, start)) for log in _logs(pair))
    assert probes.field_names(real_line) == probes.field_names(sim_line)


def test_the_workload_mode_reads_the_kv_peak_from_both_logs(pair, tmp_path):
    """nodes/remote.py scheduler_log_command, run by bash over each server's log."""
    for index, log_text in enumerate(_logs(pair)):
        log_dir = tmp_path / str(index)
        log_dir.mkdir()
        Path(remote.log_file(str(log_dir), 30000)).write_text(log_text)
        out = subprocess.run(["bash", "-c", remote.scheduler_log_command(str(log_dir), [30000])], check=True,
                             capture_output=True, text=True).stdout
        (record,) = remote.parse_records(out, ("scheduler",))
        assert int(record[1]["peak_full_tokens"]) > 0 and record[1]["retracted"] == "0"


def test_a_healthy_log_has_no_fatal_line(pair):
    for log_text in _logs(pair):
        assert readiness.find_fatal(log_text.splitlines()) is None


def _sglang_retraction_template(hybrid: bool) -> str:
    """The retraction line as SGLang 0.5.23 writes it when the KV pool is full (sglang/srt/managers/scheduler.py
    update_running_batch), numbers as N."""
    source = (SGLANG / "srt" / "managers" / "scheduler.py").read_text()
    prefix = re.search(r'"(KV cache pool is full\. Retract requests\. )"', source).group(1)
    details = re.search(r'msg_details = f"(#retracted_reqs: [^"]*)"', source).group(1)
    mamba = re.search(r'msg_details \+= f"(, #mamba_num_gained: [^"]*)"', source).group(1)
    ratio = re.search(r'f"(, #new_token_ratio: [^"]*)"', source).group(1)
    line = prefix + details + (mamba if hybrid else "") + ratio
    return probes.template(re.sub(r"\{[^}]*\}", "0", line))


@pytest.mark.parametrize("hybrid", [False, True], ids=["dense", "hybrid"])
def test_the_simulators_retraction_line_is_sglangs(hybrid, capsys):
    """A pool too small for four requests retracts (tests/unit/sim/test_sim_engine.py); a hybrid pool adds the
    Mamba slots it freed."""
    from sglang_sim.engine import BatchEngine, SimClock
    from sglang_sim.perf import Timing

    require_real_sglang()  # SGLang's source, in the server venv

    async def scenario():
        flat = Timing(step_base_s=0.01, expert_stream_s=0.0, step_per_request_s=0.0, accept_length=1.0,
                      prefill_s_per_token=0.0)
        engine = BatchEngine(capacity=8, max_total_tokens=4000, timing=flat,
                             clock=SimClock(asyncio.get_running_loop(), 2000.0))
        engine.mamba_slots_per_request = 2 if hybrid else None
        await asyncio.gather(*(engine.submit(100, 1500, 1500) for _ in range(4)))

    asyncio.run(scenario())
    # capsys, not capfd: the simulator writes through sys.stderr, and a server process an earlier test of this worker
    # left running also writes to file descriptor 2, whose lines could interleave with this one
    lines = [m for m in probes.log_messages(capsys.readouterr().err) if m.startswith("KV cache pool is full")]
    assert lines and probes.template(lines[0]) == _sglang_retraction_template(hybrid)


# ---- SIGTERM: last, it stops the servers -------------------------------------------------------------------------

def _drain(server, model: str) -> dict:
    """A request in flight, SIGTERM to the server's main process (as nodes/remote.py stop_command sends it), then
    /health during the drain, the request's answer and the exit status."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("chat", probes.call(
        server.url + "/v1/chat/completions", probes.chat_body(model, max_tokens=120))))
    thread.start()
    # running is a passing state: the wait ends when the request runs, and fails at once (not at the cap) when
    # the request ended before /v1/loads showed it
    deadline = time.monotonic() + 120
    while probes.call(server.url + "/v1/loads").json["loads"][0]["num_running_reqs"] == 0:
        assert thread.is_alive(), f"{server.url}: the request ended before it was seen running: {result}"
        assert time.monotonic() < deadline, f"{server.url}: the request was not running after 120 s"
        time.sleep(0.02)
    os.kill(server.process.pid, signal.SIGTERM)
    result["health"] = probes.call(server.url + "/health").status
    thread.join(120)
    result["exit"] = server.process.wait(120)
    return result


@pytest.mark.stops_real_server
def test_sigterm_drains_the_requests_in_flight_then_exits_like_the_real_server(pair):
    model = pair.real_replies["/v1/models"].json["data"][0]["id"]
    outcomes = [_drain(server, model) for server in (pair.real, pair.sim)]
    for outcome in outcomes:
        assert (outcome["health"], outcome["chat"].status, outcome["exit"]) == (503, 200, 0)
    real_log, sim_log = _logs(pair)
    for expected in ("SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
                     "Health check request received during shutdown. Returning 503."):
        assert expected in probes.log_messages(real_log) and expected in probes.log_messages(sim_log)
    real_last, sim_last = ([m for m in probes.log_messages(log) if m.startswith("Gracefully exiting...")][-1]
                           for log in (real_log, sim_log))
    assert real_last == sim_last == "Gracefully exiting... Remaining number of requests 0. " \
                                    "Remaining requests remaining_rids=[]."


# ---- the inventories cover what the product reads -----------------------------------------------------------------

def _tree(relative: str) -> ast.Module:
    return ast.parse((PRODUCT / relative).read_text())


def _functions(tree: ast.AST, *names: str) -> list[ast.FunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in names]


def _keys_read(node: ast.AST) -> list[tuple[str, str]]:
    """(receiver, key) for every ``x.get("key")`` and ``x["key"]`` under ``node``; the receiver as source."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "get" \
                and sub.args and isinstance(sub.args[0], ast.Constant) and isinstance(sub.args[0].value, str):
            found.append((ast.unparse(sub.func.value), sub.args[0].value))
        elif isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) \
                and isinstance(sub.slice.value, str):
            found.append((ast.unparse(sub.value), sub.slice.value))
    return found


def _string_constants() -> list[tuple[str, str]]:
    """(file, text) of every string constant of the product that is not a docstring."""
    found = []
    for path in PRODUCT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        found += [(str(path.relative_to(PRODUCT)), node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]
    return found


def test_the_suite_covers_every_route_the_product_calls():
    routes = set()
    for path in PRODUCT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            call_arg = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "post") and node.args and isinstance(node.args[0], ast.Constant)
            if call_arg:
                routes.add(node.args[0].value)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                    isinstance(target, ast.Name) and target.id.endswith("_PATH") for target in node.targets):
                routes.add(node.value.value)
    routes = {route for route in routes if isinstance(route, str) and re.fullmatch(r"/[a-z0-9_/]+", route)}
    assert routes and routes <= ROUTES, f"probe these in probes.capture: {sorted(routes - ROUTES)}"


def test_the_suite_covers_every_server_info_key_the_product_reads():
    where = {"info": "$", "state": "$.internal_states[]", "states[0]": "$.internal_states[]",
             "memory": "$.internal_states[].memory_usage"}
    read = set()
    for function in _functions(_tree("nodes/readiness.py"), "parse_server_info"):
        read |= {(where[receiver], key) for receiver, key in _keys_read(function) if receiver in where}
    read |= {("$.internal_states[]", "sim")}  # ServerInfo.simulated: "sim" in state
    assert read and read <= SERVER_INFO_READ | SIMULATOR_ONLY_READ, sorted(read - SERVER_INFO_READ)


def test_the_suite_covers_every_response_field_the_client_reads():
    chat = _tree("generate/chat.py")
    read = {key for function in _functions(chat, "parse_chat_response") for _, key in _keys_read(function)}
    errors = {key for function in _functions(chat, "error_message") for _, key in _keys_read(function)}
    for path in (PRODUCT / "generate").glob("*.py"):
        read |= {key for receiver, key in _keys_read(ast.parse(path.read_text())) if receiver == "usage"}
    assert read and read <= CHAT_READ, sorted(read - CHAT_READ)
    assert errors and errors <= ERROR_READ, sorted(errors - ERROR_READ)


def test_the_suite_covers_every_metric_the_product_reads():
    names = {text for _, text in _string_constants() if re.fullmatch(r"sglang:\w+", text)}
    assert names and names <= METRICS_READ, sorted(names - METRICS_READ)


def test_the_suite_covers_every_log_needle_of_the_log_reading_modules():
    constants = set()
    for relative in LOG_READING_MODULES:
        for node in _tree(relative).body:
            if not isinstance(node, ast.Assign) or not all(isinstance(t, ast.Name) for t in node.targets):
                continue
            value = node.value
            text = isinstance(value, ast.Constant) and isinstance(value.value, str)
            pattern = isinstance(value, ast.Call) and ast.unparse(value.func) == "re.compile"
            tables = isinstance(value, ast.Tuple)
            if text or pattern or tables:
                constants |= {(relative, target.id) for target in node.targets}
    assert constants, "no constants found"
    unknown = constants - LOG_NEEDLES - NOT_LOG_TEXT - FATAL_TABLES
    assert not unknown, f"a log needle the suite does not check, or add it to NOT_LOG_TEXT: {sorted(unknown)}"


def test_the_suite_covers_every_launch_flag_the_product_compares(pair):
    """nodes/readiness.py launch_differences compares each flag of a launch with its /server_info field: every
    flag the product knows must name a field both servers report (else every run would relaunch)."""
    from fleetgen.tuning.options import REJECTED_FLAGS

    # a flag, not a prefix of flags (candidates.py's "--speculative-")
    flags = {text for _, text in _string_constants() if re.fullmatch(r"--[a-z0-9][a-z0-9-]*[a-z0-9]", text)}
    flags -= set(REJECTED_FLAGS) | UNCOMPARED_FLAGS
    assert flags
    real_info, sim_info = (reply.json for reply in _both(pair, "/server_info after"))
    for name, info in (("real", real_info), ("simulated", sim_info)):
        unreported = [line for flag in sorted(flags)
                      for line in readiness.launch_differences(info, {flag: True}, expected_version=None)
                      if "does not report" in line]
        assert unreported == [], f"the {name} server: {unreported}"
