"""HTTP front of one simulated vLLM replica (aiohttp): OpenAI API, /health, /metrics.

Every request goes through the engine's queue and KV model (simulator.engine): a driver task runs
``engine.step(now)`` and sleeps the step's duration (divided by ``speedup``) on the event loop's
clock, then hands each request its token. Output text is deterministic filler (one " tok" per
token); the simulator has no EOS, so a request always produces exactly ``max_tokens`` tokens.
Latency histograms are observed on the wall clock, as a real engine's are. Prefix caching works
over HTTP: each prompt's text is cut into the prefix blocks the router also hashes
(tidegate.tokens.prefix_block_hashes), and the engine's cache and its
vllm:prefix_cache_queries/hits counters follow from them.

Sampling fields (temperature, top_p, top_k, penalties, stop, seed, ...) are validated as vLLM
validates them (simulator.validate): a wrong type or range answers 400 with vLLM's error body.

Endpoints: POST /v1/completions, POST /v1/chat/completions (SSE when ``stream``), GET /v1/models,
GET /health (503 while failing health), GET /metrics, and the simulator's own admin endpoints
POST /sim/health ``{"healthy": bool}`` and GET /sim/stats.

Simulated NVML and fault injection (SIMULATION, labelled ``"simulated": true``; see simulator.faults
for the readings' derivation and the fault body):

- GET /sim/gpu: ``{"simulated": true, "gpus": [{index, uuid, name, memory_total_bytes,
  memory_used_bytes, utilization_pct, ecc_uncorrected_volatile, ecc_corrected_volatile,
  retired_pages_pending, row_remap_failed, lost, error, temperature_c, power_w, xid_events}]}``. Each GET returns and
  clears the Xid events queued since the previous GET, like an NVML event set.
- GET /sim/faults: the injected fault state. POST /sim/faults: inject (400 on a bad body); answers
  ``{"simulated": true, "healthy": bool, "faults": {...}}``.

What the engine does under each fault:

- xid, ecc_*, row_remap_failed: readings only; serving goes on (the control plane must act on
  the reports).
- gpu_lost: like vLLM when its GPU falls off the bus, the engine is dead: in-flight requests are
  aborted, new ones fail with 500 (EngineDeadError) and /health answers 503. The process stays up
  (as with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH) so that the lost GPU can still be reported;
  ``{"gpu_lost": false}`` or a clear revives it. Use ``crash`` for a process that goes away.
- oom: new requests fail with 500 and PyTorch's "CUDA out of memory" text while /health stays 200
  and in-flight requests complete; the GPU reads full memory and its error says "out of memory".
  (A real vLLM usually dies on a runtime OOM; this models the degraded-but-alive case the control
  plane must cut weight for.)
- health: ``false`` makes /health answer 503 (as POST /sim/health does); ``true`` restores it.
- crash: the answer is sent, then the process exits at once with status 70, skipping cleanup, like
  an engine process dying. Only a `tidegate sim` process can crash; an app built without
  ``on_crash`` answers 409.
- clear: every fault (or, with ``gpu``, that GPU's) is cleared and health restored.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog
from aiohttp import web

from tidegate import tokens
from tidegate.aio import cancel_and_wait
from tidegate.errors import PromptTooLargeError, RequestError
from tidegate.simulator.engine import Engine, RequestOutput
from tidegate.simulator.faults import FaultError, SimulatedGpus, layout_for, parse_fault
from tidegate.simulator.metrics import SimMetrics
from tidegate.simulator.validate import SamplingError, check_sampling, vllm_error_body

log = structlog.get_logger(__name__)

FILLER_TOKEN = " tok"
OWNED_BY = "tidegate-sim"


@dataclass
class _Track:
    arrival: float
    queue: asyncio.Queue[RequestOutput | None] = field(default_factory=asyncio.Queue)
    last_token: float | None = None
    done: bool = False


def _error(status: int, message: str, code: str | None = None, etype: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": etype, "param": None, "code": code}},
                             status=status)


class _BadRequest(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


class SimServer:
    """Owns the engine, the driver task and the per-request token queues of one replica."""

    def __init__(self, engine: Engine, model: str, *, metrics_flavor: str = "vllm", speedup: float = 1.0,
                 fail_health: bool = False, gpus: SimulatedGpus | None = None,
                 on_crash: Callable[[], None] | None = None) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be positive")
        self.engine = engine
        self.model = model
        self.speedup = speedup
        self.fail_health = fail_health
        self.gpus = gpus or SimulatedGpus(layout_for(engine.profile), ["GPU-" + str(uuid.uuid4())])
        self._on_crash = on_crash
        self.metrics = SimMetrics(engine, model, metrics_flavor, time_scale=1.0 / speedup)
        self._tracks: dict[str, _Track] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ driver

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._drive(), name="sim-driver")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        for track in self._tracks.values():
            track.queue.put_nowait(None)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        # Steps run back to back on a deadline timeline, so the time spent between steps (HTTP
        # writes, sleep overshoot) is absorbed instead of stretching every step; when the process
        # falls behind (CPU-starved), the timeline restarts from now rather than bursting to catch up.
        deadline = loop.time()
        while True:
            if not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            start = max(deadline, loop.time() - 0.002)
            try:
                res = self.engine.step(start)
            except Exception:
                log.exception("sim_step_failed")
                self._abort_all()
                continue
            if res.num_scheduled_tokens == 0:
                # Nothing fits this step (cannot happen with validated requests); do not spin.
                await asyncio.sleep(0.001)
                continue
            self.gpus.busy.record(start, start + res.duration_s / self.speedup)
            deadline = start + res.duration_s / self.speedup
            # sleep(0) still yields, so handlers run between the steps of the instant profile.
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            now = loop.time()
            for out in res.outputs:
                if out.new_tokens == 0:
                    continue
                track = self._tracks.get(out.req_id)
                if track is None:  # aborted while the step ran
                    continue
                if out.first_token:
                    self.metrics.observe_first_token(now - track.arrival)
                elif track.last_token is not None:
                    self.metrics.observe_inter_token(now - track.last_token)
                track.last_token = now
                if out.finished:
                    self.metrics.observe_finished(now - track.arrival, out.finish_reason or "length",
                                                  prefill_s=out.prefill_s)
                    track.done = True
                    del self._tracks[out.req_id]
                track.queue.put_nowait(out)

    def _abort_all(self) -> None:
        """Every in-flight request ends at once (the engine failed or died)."""
        for rid, track in list(self._tracks.items()):
            self.engine.abort(rid)
            track.done = True
            track.queue.put_nowait(None)
        self._tracks.clear()

    def submit(self, req_id: str, prompt_tokens: int, max_tokens: int | None,
               prefix_hashes: tuple[int, ...] = ()) -> _Track:
        """Queue a request in the engine (raises RequestError) and return its token queue.
        `prefix_hashes`: its text's prefix block ids (tokens.prefix_block_hashes)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        ids, per_id = tokens.engine_block_ids(prefix_hashes, self.engine.profile.block_size)
        self.engine.add_request(req_id, prompt_tokens, max_tokens, now, ids, per_id)
        track = _Track(arrival=now)
        self._tracks[req_id] = track
        self._wake.set()
        return track

    def abort(self, req_id: str) -> None:
        track = self._tracks.pop(req_id, None)
        if self.engine.abort(req_id):
            log.info("sim_request_aborted", request_id=req_id)
        if track is not None:
            track.done = True

    # ------------------------------------------------------------------ HTTP handlers

    @property
    def healthy(self) -> bool:
        """/health's answer: not failed on purpose, and no GPU lost (a lost GPU kills vLLM's engine)."""
        return not self.fail_health and not self.gpus.faults.any_lost

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def handle_set_health(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body must be JSON")
        if not isinstance(body, dict) or not isinstance(body.get("healthy"), bool):
            return _error(400, 'body must be {"healthy": true|false}')
        self.fail_health = not body["healthy"]
        log.info("sim_health_set", healthy=body["healthy"])
        return web.json_response({"healthy": not self.fail_health})

    async def handle_stats(self, request: web.Request) -> web.Response:
        s = self.engine.stats()
        return web.json_response({**asdict(s), "kv_usage": s.kv_usage, "profile": self.engine.profile.name,
                                  "model": self.model, "healthy": self.healthy})

    async def handle_gpu(self, request: web.Request) -> web.Response:
        now = asyncio.get_running_loop().time()
        return web.json_response(self.gpus.read(now, self.engine.stats()))

    def _fault_answer(self) -> dict[str, Any]:
        return {"simulated": True, "healthy": self.healthy, "fail_health": self.fail_health,
                "faults": self.gpus.faults.as_dict()}

    async def handle_get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self._fault_answer())

    async def handle_faults(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body must be JSON")
        try:
            fault = parse_fault(body, self.gpus.layout.gpu_count)
        except FaultError as exc:
            return _error(400, str(exc))
        if fault.crash and self._on_crash is None:
            return _error(409, "crash needs a `tidegate sim` process; this app has no on_crash hook")
        was_lost = self.gpus.faults.any_lost
        self.gpus.faults.apply(fault)
        if fault.clear and fault.gpu is None:
            self.fail_health = False
        if fault.health is not None:
            self.fail_health = not fault.health
        if self.gpus.faults.any_lost and not was_lost:
            self._abort_all()  # the engine died with its GPU
        log.warning("sim_fault_injected", gpu=fault.gpu, xids=list(fault.xids), ecc_uncorrected=fault.ecc_uncorrected,
                    ecc_corrected=fault.ecc_corrected, gpu_lost=fault.gpu_lost, oom=fault.oom, health=fault.health,
                    crash=fault.crash, clear=fault.clear, row_remap_failed=fault.row_remap_failed)
        if not fault.crash:
            return web.json_response(self._fault_answer())
        resp = web.json_response({**self._fault_answer(), "crashing": True})
        await resp.prepare(request)
        await resp.write_eof()
        self._on_crash()  # type: ignore[misc]  # checked above
        return resp

    async def handle_metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.metrics.render())
        resp.content_type = "text/plain"
        resp.charset = "utf-8"
        return resp

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": int(time.time()), "owned_by": OWNED_BY,
            "root": self.model, "parent": None, "max_model_len": self.engine.profile.max_model_len,
            "permission": [],
        }]})

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    # ------------------------------------------------------------------ generation

    def _parse(self, body: Any, chat: bool) -> tuple[int, int | None, bool, bool]:
        """(prompt_tokens, max_tokens, stream, include_usage) or _BadRequest."""
        if not isinstance(body, dict):
            raise _BadRequest(_error(400, "request body must be a JSON object"))
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _BadRequest(_error(400, "'model' is required and must be a string"))
        if model != self.model:
            raise _BadRequest(_error(404, f"The model `{model}` does not exist.", "model_not_found"))
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _BadRequest(_error(400, "'stream' must be a boolean"))
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise _BadRequest(_error(400, "'stream_options' must be an object"))
        include_usage = bool(opts.get("include_usage", False))
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise _BadRequest(_error(400, "'max_tokens' must be a positive integer"))
        n = body.get("n", 1)
        if n != 1:
            raise _BadRequest(_error(400, "the simulator supports only n=1"))
        try:
            check_sampling(body, chat, max_tokens)
        except SamplingError as exc:
            raise _BadRequest(web.json_response(vllm_error_body(str(exc), exc.param), status=400)) from None
        if chat:
            messages = body.get("messages")
            if (not isinstance(messages, list) or not messages
                    or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
                raise _BadRequest(_error(400, "'messages' must be a non-empty list of {role, content} objects"))
            try:
                prompt_tokens = tokens.count_chat_tokens(messages)
            except TypeError as exc:
                raise _BadRequest(_error(400, str(exc))) from None
            except UnicodeEncodeError:  # a lone surrogate escape ("\ud800")
                raise _BadRequest(_error(400, "'messages' holds text that is not valid Unicode")) from None
        else:
            prompt = body.get("prompt")
            if prompt is None:
                raise _BadRequest(_error(400, "'prompt' is required"))
            try:
                prompt_tokens = tokens.count_completion_prompt_tokens(prompt)
            except TypeError as exc:
                raise _BadRequest(_error(400, str(exc))) from None
            except UnicodeEncodeError:
                raise _BadRequest(_error(400, "'prompt' holds text that is not valid Unicode")) from None
        return prompt_tokens, max_tokens, stream, include_usage

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        except RecursionError:
            return _error(400, "request body is nested too deeply")
        try:
            prompt_tokens, max_tokens, stream, include_usage = self._parse(body, chat)
        except _BadRequest as bad:
            return bad.response
        if self.gpus.faults.any_lost:
            return _error(500, "EngineCore is dead: GPU is lost (simulated gpu_lost fault)", etype="EngineDeadError")
        if self.gpus.faults.oom:
            return _error(500, self.gpus.oom_message(), etype="InternalServerError")
        req_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        try:
            # Hashed here, from the text received, so that caching happens over HTTP as in vLLM.
            hashes = tokens.prefix_block_hashes(tokens.prefix_bytes(body, chat)) \
                if self.engine.enable_prefix_caching else ()
            track = self.submit(req_id, prompt_tokens, max_tokens, hashes)
        except PromptTooLargeError as exc:
            return _error(400, str(exc), "context_length_exceeded")
        except RequestError as exc:
            return _error(400, str(exc))
        created = int(time.time())
        try:
            if stream:
                return await self._stream(request, track, req_id, created, chat, prompt_tokens, include_usage)
            return await self._complete(request, track, req_id, created, chat, prompt_tokens)
        except ConnectionResetError:
            log.info("sim_client_disconnected", request_id=req_id)
            return web.Response(status=499)
        finally:
            if not track.done:
                # Client went away (or the handler failed) before the end: free the KV now.
                self.abort(req_id)

    async def _next(self, track: _Track) -> RequestOutput:
        out = await track.queue.get()
        if out is None:
            raise web.HTTPServiceUnavailable(text="simulator engine stopped")
        return out

    async def _complete(self, request: web.Request, track: _Track, req_id: str, created: int, chat: bool,
                        prompt_tokens: int) -> web.Response:
        n_out = 0
        while True:
            out = await self._next(track)
            n_out = out.num_output_tokens
            if out.finished:
                break
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("client disconnected")
        text = FILLER_TOKEN * n_out
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_out, "total_tokens": prompt_tokens + n_out}
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": "length", "stop_reason": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            obj = "text_completion"
        return web.json_response({"id": req_id, "object": obj, "created": created, "model": self.model,
                                  "choices": [choice], "usage": usage})

    async def _stream(self, request: web.Request, track: _Track, req_id: str, created: int, chat: bool,
                      prompt_tokens: int, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            payload: dict[str, Any] = {"id": req_id, "object": obj, "created": created, "model": self.model,
                                       "choices": choices}
            if usage is not None:
                payload["usage"] = usage
            return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

        write: Callable[[bytes], Awaitable[None]] = resp.write
        if chat:
            await write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]))
        n_out = 0
        while True:
            out = await self._next(track)
            n_out = out.num_output_tokens
            reason = out.finish_reason if out.finished else None
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": FILLER_TOKEN}, "logprobs": None,
                                          "finish_reason": reason}
            else:
                choice = {"index": 0, "text": FILLER_TOKEN, "logprobs": None, "finish_reason": reason}
            if out.finished:
                choice["stop_reason"] = None
            await write(chunk([choice]))
            if out.finished:
                break
        if include_usage:
            await write(chunk([], {"prompt_tokens": prompt_tokens, "completion_tokens": n_out,
                                   "total_tokens": prompt_tokens + n_out}))
        await write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


SIM_KEY = web.AppKey("tidegate_sim", SimServer)


def _require_api_key(api_key: str) -> Any:
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


def create_app(engine: Engine, model: str, *, metrics_flavor: str = "vllm", speedup: float = 1.0,
               fail_health: bool = False, gpus: SimulatedGpus | None = None,
               on_crash: Callable[[], None] | None = None, api_key: str | None = None) -> web.Application:
    """The aiohttp application of one simulated replica; ``app[SIM_KEY]`` is its SimServer.
    Serve it with ``web.AppRunner(app, handler_cancellation=True)`` so that a client that goes
    away cancels its handler (and frees its KV) at once. ``gpus``: the simulated GPUs (default:
    the profile's layout, one random uuid). ``on_crash``: what a ``{"crash": true}`` fault calls
    (it should not return); without it that fault answers 409. ``api_key``: require it as a bearer
    token on /v1 routes, answering 401 like vLLM's --api-key."""
    sim = SimServer(engine, model, metrics_flavor=metrics_flavor, speedup=speedup, fail_health=fail_health,
                    gpus=gpus, on_crash=on_crash)
    app = web.Application(middlewares=[_require_api_key(api_key)] if api_key else [])
    app[SIM_KEY] = sim

    async def _on_startup(_: web.Application) -> None:
        await sim.start()

    async def _on_cleanup(_: web.Application) -> None:
        await sim.stop()

    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    app.router.add_post("/v1/completions", sim.handle_completions)
    app.router.add_post("/v1/chat/completions", sim.handle_chat)
    app.router.add_get("/v1/models", sim.handle_models)
    app.router.add_get("/health", sim.handle_health)
    app.router.add_get("/metrics", sim.handle_metrics)
    app.router.add_post("/sim/health", sim.handle_set_health)
    app.router.add_get("/sim/stats", sim.handle_stats)
    app.router.add_get("/sim/gpu", sim.handle_gpu)
    app.router.add_get("/sim/faults", sim.handle_get_faults)
    app.router.add_post("/sim/faults", sim.handle_faults)
    return app
