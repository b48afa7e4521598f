"""The conformance suite's probes: one set of HTTP requests and log readings run against a real SGLang 0.5.23
server and against the simulator (``include/sglang_sim``), and the comparison of what came back.

What is compared is the *shape* of each answer (status codes, JSON keys and JSON types, with the real server's as
the reference), metric names, types and label names, and the log lines the product parses. Values are compared
only where the product decides on them (a null where it expects a number). The simulator is a GPU server and the
real one runs on CPU: where that alone makes them differ it is listed in ``CPU_ONLY`` below, with the reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.real_sglang import server as real

# The simulated node: a quick load, and decoding at about the pace of the real server on this CPU (100 tokens/s), so
# a request is still running when a probe looks for it.
SIM_SETTINGS = {"time_scale": 1, "load_seconds": 0.3, "decode_base_ms": 10.0}
# Flags of the real server that a GPU server has no use for (the simulator refuses --device).
CPU_ONLY_FLAGS = ("--device",)

# A chat request long enough for one "Decode batch" line (--decode-log-interval 40 decode steps).
CHAT_MAX_TOKENS = 60
QUESTION = [{"role": "user", "content": "Why is the sum of two even numbers even?"}]


def sim_flags(reference: real.RealServer) -> list[str]:
    """The flags ``reference`` was launched with (model path, host and port aside), less the CPU-only ones."""
    words = real.launch_argv(reference.model_dir, reference.port, *reference.flags, kv_tokens=reference.kv_tokens)
    words = words[words.index("--model-path") + 2:]
    flags, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in CPU_ONLY_FLAGS + ("--host", "--port"):
            skip = True
        else:
            flags.append(word)
    return flags


@dataclass
class SimServer(real.ServerProcess):
    """``python -m sglang_sim.server`` on a one-GPU simulated node, with RealServer's interface."""

    KIND = "simulated server"
    READY_TIMEOUT_S = 60.0
    POLL_S = 0.02

    model_dir: Path
    port: int
    root: Path
    flags: tuple[str, ...] = ()
    process: subprocess.Popen | None = None
    health_codes: list = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def start(self) -> "SimServer":
        from sglang_sim.node import create_node

        node = create_node(self.root / "node", name="node0", gpus=1, sim=SIM_SETTINGS)
        env = {**os.environ, **node.env(), "CUDA_VISIBLE_DEVICES": "0"}
        argv = [sys.executable, "-m", "sglang_sim.server", "--model-path", str(self.model_dir), "--host",
                "127.0.0.1", "--port", str(self.port), *self.flags]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait()


# ---- HTTP ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict
    body: bytes

    @property
    def json(self):
        return json.loads(self.body)

    @property
    def events(self) -> list:
        """The ``data:`` payloads of a server-sent event stream, ``[DONE]`` kept as the string."""
        payloads = [part[len("data: "):] for part in self.body.decode().split("\n\n") if part.startswith("data: ")]
        return [payload if payload == "[DONE]" else json.loads(payload) for payload in payloads]


def call(url: str, body: dict | None = None, timeout: float = 120.0) -> Reply:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def chat_body(model: str, **extra) -> dict:
    return {"model": model, "messages": QUESTION, "max_tokens": CHAT_MAX_TOKENS, "temperature": 0, **extra}


def capture(url: str) -> dict[str, Reply]:
    """Every probe once, in an order that leaves a Decode batch line in the log before the last readings."""
    replies = {path: call(url + path) for path in
               ("/health", "/health_generate", "/ready", "/model_info", "/server_info", "/get_server_info",
                "/v1/models", "/v1/loads", "/metrics", "/no_such_route")}
    model = replies["/v1/models"].json["data"][0]["id"]
    context = replies["/v1/models"].json["data"][0]["max_model_len"]
    replies["chat"] = call(url + "/v1/chat/completions", chat_body(model))
    replies["chat_stream"] = call(url + "/v1/chat/completions", chat_body(model, stream=True))
    replies["chat_stream_usage"] = call(url + "/v1/chat/completions", chat_body(
        model, stream=True, stream_options={"include_usage": True}))
    # a prompt longer than the context (both tokenizers give at least a token per word), and one whose
    # completion budget overruns it
    too_long = [{"role": "user", "content": "fox " * (context + 100)}]
    replies["chat_prompt_too_long"] = call(url + "/v1/chat/completions",
                                           {"model": model, "messages": too_long, "max_tokens": 8})
    replies["chat_budget_too_long"] = call(url + "/v1/chat/completions", chat_body(model, max_tokens=context))
    for path in ("/metrics", "/server_info", "/v1/loads"):
        replies[f"{path} after"] = call(url + path)
    return replies


# ---- shapes --------------------------------------------------------------------------------------------------

def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def shape_differences(reference, other, path: str = "$", *, extra_ok: frozenset = frozenset(),
                      type_ok: frozenset = frozenset(), subset: bool = False) -> list[str]:
    """How ``other`` differs from ``reference`` in keys and JSON types, recursively (arrays by their first
    element). ``extra_ok``: paths ``other`` may add; ``type_ok``: paths whose type may differ; ``subset``:
    ``other`` may leave out keys."""
    found = []
    nested = {"extra_ok": extra_ok, "type_ok": type_ok, "subset": subset}
    if json_type(reference) != json_type(other):
        if path not in type_ok:
            found.append(f"{path}: {json_type(other)}, the real server has {json_type(reference)}")
        return found
    if isinstance(reference, dict):
        for key in reference:
            if key not in other:
                found += [] if subset else [f"{path}.{key}: missing"]
            else:
                found += shape_differences(reference[key], other[key], f"{path}.{key}", **nested)
        found += [f"{path}.{key}: not sent by the real server" for key in other
                  if key not in reference and f"{path}.{key}" not in extra_ok]
    elif isinstance(reference, list) and reference and other:
        found += shape_differences(reference[0], other[0], f"{path}[]", **nested)
    return found


def chunk_kinds(events: list) -> list[str]:
    """A chat stream as the sequence of its chunk kinds (runs of the same kind collapsed)."""
    kinds = []
    for event in events:
        if event == "[DONE]":
            kind = "done"
        elif not event["choices"]:
            kind = "usage"
        elif event["choices"][0]["finish_reason"] is not None:
            kind = "finish"
        elif "role" in event["choices"][0]["delta"]:
            kind = "role"
        else:
            kind = "content"
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


def chunk_of_kind(events: list, kind: str) -> dict:
    for event in events:
        if event != "[DONE]" and chunk_kinds([event]) == [kind]:
            return event
    raise AssertionError(f"the stream has no {kind} chunk")


# ---- metrics ---------------------------------------------------------------------------------------------------

def metric_families(text: str) -> dict[str, tuple[str, frozenset]]:
    """``{sample name: (family type, label names)}`` of a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name] = (family.type, frozenset(sample.labels))
    return found


# ---- log lines -------------------------------------------------------------------------------------------------

_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?P<rank>(?: [A-Z_]+\d+)*)\] ")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def log_messages(text: str) -> list[str]:
    """The messages of a server log's stamped lines, without the stamp."""
    return [_STAMP.sub("", line) for line in text.splitlines() if _STAMP.match(line)]


def log_prefixes(text: str) -> set[str]:
    """The rank prefixes (``" TP0"``, ``" DP1 TP0"``...) on a log's stamped lines; ``""`` for none."""
    return {match.group("rank") for line in text.splitlines() if (match := _STAMP.match(line))}


def template(message: str) -> str:
    """A log message with its numbers replaced by ``N`` and the graph label made neutral: a GPU server prints
    ``cuda graph:`` where a CPU server prints ``cpu graph:`` (``sglang/srt/managers/scheduler_components/
    metrics_reporter.py`` ``_graph_backend_label``)."""
    return _NUMBER.sub("N", re.sub(r"\b(?:cuda|cpu) graph:", "GRAPH graph:", message))


def first_message(text: str, start: str) -> str:
    for message in log_messages(text):
        if message.startswith(start):
            return message
    raise AssertionError(f"no log line starts with {start!r}")


def field_names(message: str) -> list[str]:
    """The ``name: value`` field names of a batch line, in order (``Decode batch, #running-req: 1, ...``)."""
    return [part.split(":")[0].strip() for part in message.split(", ")[1:]]
