"""SGLang's HTTP API on top of the batching engine (docs/sglang-memory-model.md §5, §6).

Routes: /health, /health_generate, /ready, /model_info (+/get_model_info), /server_info
(+/get_server_info), /v1/models, /v1/loads, /v1/chat/completions, /generate, and /metrics with
--enable-metrics; every other path answers FastAPI's 404 ``{"detail":"Not Found"}`` (405
``{"detail":"Method Not Allowed"}`` for a known path), as SGLang 0.5.23 does. With --api-key every
route except /health*, /ready* and /metrics* needs
``Authorization: Bearer <key>`` (401 ``{"error":"Unauthorized"}``). Plain Starlette routes, no
middleware: this path serves benchmarks.

Prompt tokens are estimated from text (~4 characters a token plus chat-template overhead);
``meta_info.e2e_latency`` is in simulated seconds. Streams send their chunks when the generation
finishes (reasoning first, then the answer), not token by token.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sglang_sim import observability
from sglang_sim.service import Service
from sglang_sim.simlog import log
from sglang_sim.textgen import (estimate_chat_tokens, estimate_text_tokens, messages_text, plan_output,
                                  render_text)

OPEN_PREFIXES = ("/health", "/ready", "/metrics")
# the model a chat response names when the request names none (sglang/srt/entrypoints/openai/protocol.py)
DEFAULT_MODEL_NAME = "default"


def _json(data, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status_code=status, media_type="application/json")


def _openai_error(message: str, status: int, kind: str = "BadRequestError") -> Response:
    return _json({"object": "error", "message": message, "type": kind, "param": None, "code": status}, status)


def _native_error(message: str, status: int) -> Response:
    kind = "invalid_request_error" if status < 500 else "internal_server_error"
    return _json({"error": {"message": message, "type": kind, "code": status}}, status)


class Api:
    def __init__(self, service: Service) -> None:
        self.svc = service

    # ---- guards ----
    async def _gate(self, request: Request) -> Response | None:
        """Hang, auth. Returns a response to send instead, or None to proceed."""
        if self.svc.hung:
            await asyncio.Event().wait()  # never set: the server stopped answering
        key = self.svc.args.api_key
        if key and not request.url.path.startswith(OPEN_PREFIXES):
            if request.headers.get("authorization") != f"Bearer {key}":
                return _json({"error": "Unauthorized"}, 401)
        return None

    def _injected_500(self) -> bool:
        if not self.svc.ready:
            return False
        self.svc.requests_received += 1
        seq = self.svc.requests_received
        faults = self.svc.faults
        if faults.http_500_after is not None and seq > faults.http_500_after:
            return True
        if faults.http_500_rate > 0:
            digest = hashlib.blake2b(f"{self.svc.settings.seed}/{self.svc.args.port}/{seq}".encode(),
                                     digest_size=8).digest()
            return int.from_bytes(digest, "big") / 2**64 < faults.http_500_rate
        return False

    def _validate_length(self, prompt_tokens: int, max_new: int | None) -> str | None:
        ctx = self.svc.launch.context_len
        if prompt_tokens >= ctx:
            return f"The input ({prompt_tokens} tokens) is longer than the model's context length ({ctx} tokens)."
        if max_new is not None and max_new + prompt_tokens >= ctx:
            return (f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                    f"You requested a total of {max_new + prompt_tokens} tokens: {prompt_tokens} tokens "
                    f"from the input messages and {max_new} tokens for the completion. Please reduce the "
                    f"number of tokens in the input messages or the completion to fit within the limit.")
        limit = self.svc.plan.max_req_input_len
        if prompt_tokens >= limit:
            return (f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length ({limit} tokens). "
                    f"Use a shorter input or enable --allow-auto-truncate.")
        return None

    # ---- routes ----
    async def health(self, request: Request) -> Response:
        if (denied := await self._gate(request)) is not None:
            return denied
        if self.svc.draining:
            log("Health check request received during shutdown. Returning 503.")
            return Response(status_code=503)
        if not self.svc.ready:
            return Response(status_code=503)
        # /health and /health_generate alike (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION defaults on): healthy
        # when the scheduler is producing tokens, else after a one-token generation of its own
        if not any(engine.running for engine in self.svc.engines):
            await self.svc.generate(1, 1, counted=False)
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        if (denied := await self._gate(request)) is not None:
            return denied
        return Response(status_code=200 if self.svc.ready and not self.svc.draining else 503)

    async def model_info(self, request: Request) -> Response:
        return await self._gate(request) or _json(self.svc.model_info())

    async def server_info(self, request: Request) -> Response:
        return await self._gate(request) or _json(self.svc.server_info())

    async def models(self, request: Request) -> Response:
        if (denied := await self._gate(request)) is not None:
            return denied
        name = self.svc.served_model_name
        return _json({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(self.svc.started_at), "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": self.svc.launch.context_len}]})

    async def metrics(self, request: Request) -> Response:
        if not self.svc.args.enable_metrics:  # SGLang mounts /metrics only with --enable-metrics
            return _json({"detail": "Not Found"}, 404)
        return Response(self.svc.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def loads(self, request: Request) -> Response:
        """``entrypoints/v1_loads.py``: ?dp_rank=, ?include=core,memory,spec,..., ?format=prometheus."""
        if (denied := await self._gate(request)) is not None:
            return denied
        query = request.query_params
        try:
            dp_rank = int(query["dp_rank"]) if query.get("dp_rank") not in (None, "") else None
        except ValueError:
            return _json({"detail": [{"type": "int_parsing", "loc": ["query", "dp_rank"],
                                      "msg": "Input should be a valid integer, unable to parse string as an integer",
                                      "input": query["dp_rank"]}]}, 422)
        include = {part.strip() for part in query["include"].split(",")} if query.get("include") else None
        try:
            body = observability.loads_body(self.svc, dp_rank=dp_rank, include=include)
        except observability.LoadsError as error:
            return _json({"detail": str(error)}, 400)
        if query.get("format") == "prometheus":
            return Response(observability.loads_prometheus(body["loads"]),
                            media_type="text/plain; version=0.0.4; charset=utf-8")
        return _json(body)

    async def chat(self, request: Request) -> Response:
        if (denied := await self._gate(request)) is not None:
            return denied
        try:
            body = json.loads(await request.body())
            messages = body["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages must be a non-empty list")
        except (ValueError, KeyError, TypeError) as exc:
            return _openai_error(f"Invalid request: {exc}", 400)
        if self._injected_500():
            return _openai_error("Internal server error", 500, "InternalServerError")
        prompt_tokens = estimate_chat_tokens(messages)
        max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        if (problem := self._validate_length(prompt_tokens, max_new)) is not None:
            return _openai_error(problem, 400)
        if max_new is None:
            max_new = self.svc.launch.context_len - prompt_tokens - 1
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True) is not False
        settings = self.svc.settings
        plan = plan_output(messages_text(messages), seed=settings.seed, mean_tokens=settings.output_mean_tokens,
                           shape=settings.output_shape, think_share=settings.think_share,
                           max_tokens=int(max_new), thinking=thinking)
        result = await self.svc.generate(prompt_tokens, plan.completion_tokens, max_new_tokens=int(max_new))
        split = bool(self.svc.args.reasoning_parser) and body.get("separate_reasoning", True) is not False
        reasoning, content = render_text(plan, split_reasoning=split)
        rid = uuid.uuid4().hex
        created = int(time.time())
        finish = plan.finish_reason
        matched = self.svc.model.eos_token_id if finish == "stop" else None
        # the scheduler counts reasoning tokens of a request in thinking mode, which needs a reasoning parser
        # (sglang/srt/entrypoints/openai/serving_chat.py _get_reasoning_from_request)
        reasoning_tokens = plan.reasoning_tokens if self.svc.args.reasoning_parser else 0
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + result.completion_tokens,
                 "completion_tokens": result.completion_tokens, "prompt_tokens_details": None,
                 "reasoning_tokens": reasoning_tokens,
                 "completion_tokens_details": {"reasoning_tokens": reasoning_tokens} if reasoning_tokens else None}
        if body.get("stream"):
            return self._chat_stream(body, rid, created, reasoning, content, finish, matched, usage)
        # ChatMessage leaves tool_calls out when there are none (sglang/srt/entrypoints/openai/protocol.py)
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        version = self.svc.args.weight_version
        return _json({"id": rid, "object": "chat.completion", "created": created,
                      "model": body.get("model") or DEFAULT_MODEL_NAME,
                      "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                                   "matched_stop": matched}],
                      "usage": usage,
                      # sglang/srt/utils/weight_versions.py: the versions that produced each span of the output
                      "metadata": {"weight_version": version, "weight_versions": [
                          {"version": version, "start": 0, "end": result.completion_tokens}]}})

    def _chat_stream(self, body, rid, created, reasoning, content, finish, matched, usage) -> Response:
        model = body.get("model") or DEFAULT_MODEL_NAME

        def chunk(delta: dict, finish_reason=None, matched_stop=None) -> str:
            # sglang/srt/entrypoints/openai/sse_utils.py: a delta always carries reasoning_content (null or
            # text) and leaves out an unset role or content; a choice always carries matched_stop
            choice = {"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                      "finish_reason": finish_reason, "matched_stop": matched_stop}
            return "data: " + json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created,
                                          "model": model, "choices": [choice]}, separators=(",", ":")) + "\n\n"

        parts = [chunk({"role": "assistant", "content": ""})]
        if reasoning:
            parts.append(chunk({"reasoning_content": reasoning}))
        if content:
            parts.append(chunk({"content": content}))
        parts.append(chunk({}, finish, matched_stop=matched))
        if (body.get("stream_options") or {}).get("include_usage"):
            parts.append("data: " + json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created,
                                                "model": model, "choices": [], "usage": usage}) + "\n\n")
        parts.append("data: [DONE]\n\n")
        return StreamingResponse(iter(parts), media_type="text/event-stream")

    async def generate(self, request: Request) -> Response:
        if (denied := await self._gate(request)) is not None:
            return denied
        try:
            body = json.loads(await request.body())
            text, ids = body.get("text"), body.get("input_ids")
            if text is None and ids is None:
                raise ValueError("Either text or input_ids should be provided.")
        except (ValueError, TypeError) as exc:
            return _native_error(str(exc), 400)
        batched = isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list))
        items = (text if text is not None else ids) if batched else [text if text is not None else ids]
        params = body.get("sampling_params") or {}
        params_list = params if isinstance(params, list) else [params] * len(items)
        if self._injected_500():
            return _native_error("Internal server error", 500)
        jobs = []
        for item, sampling in zip(items, params_list):
            prompt_tokens = estimate_text_tokens(item) if isinstance(item, str) else len(item)
            max_new = int(sampling.get("max_new_tokens", 128))
            if (problem := self._validate_length(prompt_tokens, max_new)) is not None:
                return _native_error(problem, 400)
            settings = self.svc.settings
            plan = plan_output(item if isinstance(item, str) else str(item), seed=settings.seed,
                               mean_tokens=settings.output_mean_tokens, shape=settings.output_shape,
                               think_share=settings.think_share, max_tokens=max_new)
            jobs.append((prompt_tokens, plan, max_new))
        results = await asyncio.gather(*(self.svc.generate(p, plan.completion_tokens, max_new_tokens=max_new)
                                         for p, plan, max_new in jobs))
        outputs = [self._generate_output(p, plan, res) for (p, plan, _), res in zip(jobs, results)]
        if body.get("stream"):
            lines = [f"data: {json.dumps(o, separators=(',', ':'))}\n\n" for o in outputs] + ["data: [DONE]\n\n"]
            return StreamingResponse(iter(lines), media_type="text/event-stream")
        return _json(outputs if batched else outputs[0])

    def _generate_output(self, prompt_tokens: int, plan, result) -> dict:
        _, text = render_text(plan, split_reasoning=False)
        finish = ({"type": "stop", "matched": self.svc.model.eos_token_id} if plan.finish_reason == "stop"
                  else {"type": "length", "length": result.completion_tokens})
        meta = {"id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": prompt_tokens,
                "weight_version": self.svc.args.weight_version, "num_retractions": result.retractions,
                "reasoning_tokens": 0,
                "completion_tokens": result.completion_tokens, "cached_tokens": 0,
                "e2e_latency": round(result.e2e_seconds, 4)}
        if self.svc.launch.spec_algorithm:
            meta.update(self.svc.spec_meta(result))
        return {"text": text, "output_ids": self.svc.output_ids(result.completion_tokens, plan.text_offset),
                "meta_info": meta}


def build_app(service: Service) -> Starlette:
    api = Api(service)
    routes = [
        Route("/health", api.health), Route("/health_generate", api.health), Route("/ready", api.ready),
        Route("/model_info", api.model_info), Route("/get_model_info", api.model_info),
        Route("/server_info", api.server_info), Route("/get_server_info", api.server_info),
        Route("/v1/models", api.models), Route("/metrics", api.metrics), Route("/v1/loads", api.loads),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/generate", api.generate, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed})


async def _not_found(request: Request, exc) -> Response:
    return _json({"detail": "Not Found"}, 404)


async def _not_allowed(request: Request, exc) -> Response:
    return _json({"detail": "Method Not Allowed"}, 405)
