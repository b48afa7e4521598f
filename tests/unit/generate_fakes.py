"""An in-process fake fleet behind httpx.MockTransport, and helpers to read a shard's output and to mark a run
validated."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path

import httpx

from fleetgen.generate import GenerationSettings, ServerEndpoint, ShardRunOptions
from fleetgen.outputs import RunLayout
from fleetgen.prompts.scan import plan_shards

FAST = dict(retry_backoff_s=0.01, recheck_initial_s=0.02, recheck_max_s=0.1, all_down_timeout_s=5.0)


def fast_settings(**overrides) -> GenerationSettings:
    return GenerationSettings(**{"model": "test-model", "max_tokens": 64, **FAST, **overrides})


def write_prompts(path: Path, count: int, *, extra: dict | None = None) -> dict:
    """A prompts file of ``count`` chat prompts; returns its single shard."""
    with path.open("w") as handle:
        for number in range(count):
            record = {"id": f"p{number:04d}", "messages": [{"role": "user", "content": f"question {number}"}]}
            record.update((extra or {}).get(record["id"], {}))
            handle.write(json.dumps(record) + "\n")
    return plan_shards(path, shard_size=count)[0]


def completion_body(prompt_id: str, tokens: int = 10) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"answer to {prompt_id}",
                                     "reasoning_content": f"thinking about {prompt_id}"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens}}


class FakeFleet:
    """Servers named "s0:1", "s1:1", ...; ``behaviour[name](prompt_id, attempt_on_server)`` may
    return an httpx.Response or raise an httpx error; the default answers after ``delay_s``."""

    def __init__(self, count: int, *, delay_s: float | dict = 0.002, limit: int = 4) -> None:
        self.names = [f"s{i}:1" for i in range(count)]
        self.delay_s = delay_s if isinstance(delay_s, dict) else {name: delay_s for name in self.names}
        self.limit = limit
        self.behaviour: dict = {}
        self.health: dict = {}
        self.in_flight: Counter = Counter()
        self.max_in_flight: Counter = Counter()
        self.requests: Counter = Counter()  # per server
        self.by_prompt: dict[str, list[str]] = defaultdict(list)  # prompt id -> servers asked
        self.bodies: dict[str, dict] = {}
        self.headers: list[httpx.Headers] = []
        self.scrapes: Counter = Counter()  # /metrics requests per server
        self.server_info: dict = {}  # name -> /server_info body, or a function of the name giving one
        self.info_reads: Counter = Counter()  # /server_info requests per server

    def endpoints(self, limit: int | None = None) -> list[ServerEndpoint]:
        return [ServerEndpoint(name=name, url=f"http://{name}", max_in_flight=limit or self.limit)
                for name in self.names]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def options(self, **overrides) -> ShardRunOptions:
        """A shard's options whose requests reach this fleet; ``overrides`` set the others."""
        return ShardRunOptions(transport=self.transport(), **overrides)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        name = f"{request.url.host}:{request.url.port}"
        self.headers.append(request.headers)
        if request.url.path == "/health":
            answer = self.health.get(name)
            return answer(name) if answer else httpx.Response(200)
        if request.url.path == "/server_info":
            self.info_reads[name] += 1
            answer = self.server_info.get(name, {})
            return httpx.Response(200, json=answer(name) if callable(answer) else answer)
        if request.url.path == "/metrics":
            self.scrapes[name] += 1
            return httpx.Response(200, text=metrics_page(self.in_flight[name]))
        body = json.loads(request.content)
        prompt_id = body["messages"][-1]["content"].split()[-1]
        prompt_id = f"p{int(prompt_id):04d}" if prompt_id.isdigit() else prompt_id
        self.bodies[prompt_id] = body
        self.by_prompt[prompt_id].append(name)
        self.requests[name] += 1
        number = self.requests[name]
        self.in_flight[name] += 1
        self.max_in_flight[name] = max(self.max_in_flight[name], self.in_flight[name])
        try:
            await asyncio.sleep(self.delay_s[name])
            act = self.behaviour.get(name)
            if act is not None:
                answer = act(prompt_id, number)
                if asyncio.iscoroutine(answer):  # an answer that takes its time
                    answer = await answer
                if answer is not None:
                    return answer
            return httpx.Response(200, json=completion_body(prompt_id))
        finally:
            self.in_flight[name] -= 1


def metrics_page(running: int, queue: int = 0) -> str:
    """A /metrics page as SGLang's scheduler writes it (Prometheus text, its labels)."""
    labels = 'engine_type="unified",model_name="test-model",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    return (f"# HELP sglang:num_running_reqs The number of running requests.\n"
            f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{{labels}}} {float(running)}\n"
            f"# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
            f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{{{labels}}} {float(queue)}\n"
            f"# HELP sglang:token_usage The token usage.\n"
            f"# TYPE sglang:token_usage gauge\nsglang:token_usage{{{labels}}} {running / 100}\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def shard_output(out_dir: Path, shard_id: int = 0) -> dict[str, list[dict]]:
    name = f"shard-{shard_id:05d}.jsonl"
    return {kind: read_jsonl(out_dir / kind / name) for kind in ("completions", "stats", "errors")}


def validated(layout: RunLayout, success: bool = True) -> None:
    """The validation summary validate writes, passed or not (only a passed one makes a run a source of reuse)."""
    layout.validation_summary.parent.mkdir(parents=True, exist_ok=True)
    layout.validation_summary.write_text(json.dumps({"success": success, "failed_expectations":
                                                     [] if success else ["missing_prompts", "error_share"]}))
