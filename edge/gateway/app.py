"""The HTTP routes: OpenAI's embeddings API, Hugging Face TEI's, /health and /metrics.

Each HTTP request becomes one or more runtime requests of at most ``max_texts`` texts (64),
sent over the pool at once (``CHUNKS_IN_FLIGHT`` of them per HTTP request), with the
gateway's deadline. Every response, an error included, carries the runtime's trace id(s) in
``X-Trace-Id``; an error body carries it too, in the API's own shape (``errors.py``).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import time

import numpy as np
from aiohttp import web

from edge.errors import EdgeError, ErrorCode
from edge.gateway.errors import HttpError, from_edge_error, openai_body, tei_body, tei_status
from edge.gateway.metrics import GatewayMetrics
from edge.ipc.aio import AsyncEdgePool, Unreachable

__all__ = ["Gateway", "CHUNKS_IN_FLIGHT"]

CHUNKS_IN_FLIGHT = 4  # runtime requests of one HTTP request at once: 256 texts, within a connection's share
TRACE_HEADER = "X-Trace-Id"
_dumps = json.JSONEncoder(separators=(",", ":")).encode


class Gateway:
    def __init__(self, opts, pool: AsyncEdgePool, metrics: GatewayMetrics, api_key: bytes | None) -> None:
        self.opts = opts
        self.pool = pool
        self.metrics = metrics
        self.api_key = api_key
        self.info: dict | None = None  # the runtime's model, width and limits, from its stats (once)
        self.conns: dict = {}  # RequestHandler -> [requests in progress, monotonic time of the last change]
        self.server: web.Server | None = None  # aiohttp's web.Server once listening: its ``connections`` are the open ones

    # ------------------------------------------------------------ plumbing

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=self.opts.max_body_bytes)
        app.router.add_post("/v1/embeddings", self.openai_embeddings)
        app.router.add_get("/v1/models", self.openai_models)
        app.router.add_post("/embed", self.tei_embed)
        app.router.add_post("/", self.tei_embed)  # huggingface_hub posts to the base URL itself
        app.router.add_post("/embed_all", self.tei_embed_all)
        app.router.add_get("/info", self.tei_info)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        t0 = time.monotonic()
        state = self.conns.setdefault(request.protocol, [0, t0])
        state[0] += 1
        openai = request.path.startswith("/v1/")
        try:
            if self.api_key is not None and request.path != "/health":
                self._authorize(request)
            resp = await handler(request)
        except HttpError as err:
            resp = self.error_response(err, openai)
        except web.HTTPException as exc:  # aiohttp's own: 404, 405, a header too long
            resp = self.error_response(HttpError(exc.status, ErrorCode.INVALID_FIELD, exc.reason), openai)
        finally:
            state[0] -= 1
            state[1] = time.monotonic()
        self.metrics.observe(request.match_info.route.resource.canonical if request.match_info.route.resource
                             else "other", resp.status, time.monotonic() - t0)
        return resp

    def _authorize(self, request: web.Request) -> None:
        got = request.headers.get("Authorization", "")
        scheme, _, token = got.partition(" ")
        assert self.api_key is not None
        # aiohttp decodes header bytes that are not UTF-8 as surrogates: encode them back, never raise (a 500)
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"),
                                                                 self.api_key):
            raise HttpError(401, ErrorCode.INVALID_FIELD, "missing or wrong bearer token (Authorization: Bearer ...)",
                            api_code="invalid_api_key")

    def error_response(self, err: HttpError, openai: bool) -> web.Response:
        self.metrics.errors[err.code.name] += 1
        body, status = (openai_body(err), err.status) if openai else (tei_body(err), tei_status(err))
        resp = web.Response(text=_dumps(body), status=status, content_type="application/json")
        resp.headers[TRACE_HEADER] = err.trace_id
        if err.retry_after is not None:
            resp.headers["Retry-After"] = str(err.retry_after)
        if err.status == 401:
            resp.headers["WWW-Authenticate"] = 'Bearer realm="edge"'  # RFC 6750: the scheme a client should use
        if err.status in (408, 413):
            resp.force_close()  # the rest of the body is not worth reading
        return resp

    async def read_json(self, request: web.Request):
        limit = self.opts.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise HttpError(413, ErrorCode.FRAME_TOO_LARGE,
                            f"request body of {request.content_length} bytes is over the limit of {limit} bytes")

        async def read() -> bytes:
            buf = bytearray()
            async for chunk in request.content.iter_any():
                buf += chunk
                if len(buf) > limit:
                    raise HttpError(413, ErrorCode.FRAME_TOO_LARGE, f"request body is over the limit of {limit} bytes")
            return bytes(buf)

        try:
            raw = await asyncio.wait_for(read(), self.opts.body_timeout)
        except asyncio.TimeoutError:
            raise HttpError(408, ErrorCode.INVALID_FIELD,
                            f"request body not received within {self.opts.body_timeout:g} s") from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, ErrorCode.MALFORMED_FRAME, f"request body is not valid JSON: {exc}") from None

    async def model_info(self) -> dict:
        if self.info is None:
            stats = await self._upstream(self.pool.control("stats", 2.0))
            lin, st = stats.get("lineage") or {}, stats.get("settings") or {}
            self.info = {"model": self.opts.model_name or lin.get("model") or "edge",
                         "package_sha256": lin.get("package_sha256"), "edge_version": lin.get("edge_version"),
                         "max_texts": int(st.get("max_texts", 64)), "max_text_tokens": st.get("max_text_tokens"),
                         "engine": lin.get("engine"), "device": lin.get("device")}
        return self.info

    async def _upstream(self, awaitable):
        """Await a runtime call; its failures as HttpError."""
        try:
            return await awaitable
        except EdgeError as exc:
            raise from_edge_error(exc) from None
        except Unreachable as exc:
            raise HttpError(503, ErrorCode.NOT_READY, f"the runtime is not reachable: {exc}") from None
        except (TimeoutError, asyncio.TimeoutError):
            raise HttpError(504, ErrorCode.DEADLINE_EXCEEDED, "no reply from the runtime in time") from None

    def texts_of(self, value, field: str) -> list[str]:
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not texts:
            raise HttpError(400, ErrorCode.INVALID_FIELD, f"'{field}' must be a string or a non-empty list of strings",
                            param=field)
        if not all(isinstance(t, str) for t in texts):
            raise HttpError(400, ErrorCode.INVALID_FIELD,
                            f"'{field}' must hold strings: token arrays are not accepted (LangChain: "
                            "OpenAIEmbeddings(check_embedding_ctx_length=False))", param=field)
        if len(texts) > self.opts.max_inputs:
            raise HttpError(400, ErrorCode.TOO_MANY_TEXTS,
                            f"{len(texts)} inputs in one request; at most {self.opts.max_inputs}", param=field)
        return texts

    async def embed(self, texts: list[str], truncate: bool | None) -> tuple[np.ndarray, list[int], list[str]]:
        """Embeddings (N, D), token counts, trace ids: one runtime request per ``max_texts`` texts."""
        size = self.info["max_texts"] if self.info else 64  # the protocol's default limit until stats says
        chunks = [texts[i:i + size] for i in range(0, len(texts), size)]
        gate = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

        async def one(chunk):
            async with gate:
                return await self._upstream(self.pool.embed(chunk, deadline_ms=self.opts.deadline_ms,
                                                            truncate=truncate))

        if len(chunks) == 1:
            results = [await one(chunks[0])]
        else:
            tasks = [asyncio.ensure_future(one(c)) for c in chunks]
            try:
                results = await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
        self.metrics.texts += len(texts)
        emb = results[0].embeddings if len(results) == 1 else np.concatenate([r.embeddings for r in results])
        tokens = [n for r in results for n in r.meta["token_counts"]]
        return emb, tokens, [r.meta["trace_id"] for r in results]

    @staticmethod
    def _json(obj, trace_ids: list[str], status: int = 200) -> web.Response:
        resp = web.Response(text=_dumps(obj), status=status, content_type="application/json")
        resp.headers[TRACE_HEADER] = ",".join(trace_ids)
        return resp

    # ------------------------------------------------------------ OpenAI

    async def openai_embeddings(self, request: web.Request) -> web.Response:
        body = await self.read_json(request)
        if not isinstance(body, dict):
            raise HttpError(400, ErrorCode.INVALID_FIELD, "the body must be a JSON object")
        texts = self.texts_of(body.get("input"), "input")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise HttpError(400, ErrorCode.INVALID_OPTION, f"encoding_format must be 'float' or 'base64', got {fmt!r}",
                            param="encoding_format")
        emb, tokens, traces = await self.embed(texts, None)
        dims = body.get("dimensions")
        if dims is not None and dims != emb.shape[1]:
            raise HttpError(400, ErrorCode.INVALID_OPTION,
                            f"dimensions={dims!r} is not supported: this model gives {emb.shape[1]} dimensions only",
                            param="dimensions", trace_id=traces[0])
        if fmt == "base64":
            rows = [base64.b64encode(r.astype("<f4").tobytes()).decode() for r in emb]
        else:
            rows = emb.tolist()
        data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
        n = sum(tokens)
        model = (await self.model_info())["model"]
        return self._json({"object": "list", "data": data, "model": model,
                           "usage": {"prompt_tokens": n, "total_tokens": n}}, traces)

    async def openai_models(self, request: web.Request) -> web.Response:
        info = await self.model_info()
        return self._json({"object": "list", "data": [{"id": info["model"], "object": "model", "created": 0,
                                                       "owned_by": "edge"}]}, [])

    # ------------------------------------------------------------ TEI

    async def tei_embed(self, request: web.Request) -> web.Response:
        body = await self.read_json(request)
        if not isinstance(body, dict):
            raise HttpError(400, ErrorCode.INVALID_FIELD, "the body must be a JSON object")
        params = {**(body.get("parameters") or {}), **{k: v for k, v in body.items() if k != "parameters"}}
        texts = self.texts_of(params.get("inputs"), "inputs")
        if params.get("normalize") is False:
            raise HttpError(422, ErrorCode.INVALID_OPTION, "normalize=false is not supported: the runtime's "
                                                           "embeddings are L2-normalized")
        if params.get("truncation_direction") not in (None, "Right", "right"):
            raise HttpError(422, ErrorCode.INVALID_OPTION, "truncation_direction: only 'Right' is supported")
        if params.get("prompt_name") is not None:
            raise HttpError(422, ErrorCode.INVALID_OPTION, "prompt_name is not supported")
        truncate = params.get("truncate")
        if truncate is not None and not isinstance(truncate, bool):
            raise HttpError(422, ErrorCode.INVALID_OPTION, "truncate must be true or false")
        emb, _, traces = await self.embed(texts, bool(truncate))  # TEI refuses over-long inputs by default
        dims = params.get("dimensions")
        if dims is not None and dims != emb.shape[1]:
            raise HttpError(422, ErrorCode.INVALID_OPTION, f"dimensions={dims!r}: this model gives {emb.shape[1]}",
                            trace_id=traces[0])
        return self._json(emb.tolist(), traces)

    async def tei_embed_all(self, request: web.Request) -> web.Response:
        raise HttpError(501, ErrorCode.INVALID_OPTION, "/embed_all (token-level embeddings) is not served: the "
                                                       "runtime returns pooled embeddings only; use /embed")

    async def tei_info(self, request: web.Request) -> web.Response:
        info = await self.model_info()
        return self._json({"model_id": info["model"], "model_sha": info["package_sha256"], "model_dtype": "float32",
                           "model_type": {"embedding": {"pooling": "mean"}},
                           "max_concurrent_requests": self.opts.max_connections,
                           "max_input_length": info["max_text_tokens"], "max_batch_tokens": None,
                           "max_client_batch_size": self.opts.max_inputs, "tokenization_workers": 1,
                           "version": info["edge_version"], "engine": info["engine"], "device": info["device"]}, [])

    # ------------------------------------------------------------ health, metrics

    async def health(self, request: web.Request) -> web.Response:
        """200 only when the runtime answers ``ready``; 503 (with why) otherwise: not ready, not
        reachable, or no answer within 1 s (a health request in flight when the runtime died)."""
        try:
            body = await self._upstream(self.pool.control("health", 1.0))
        except HttpError as err:
            if err.status == 503:
                raise
            raise HttpError(503, ErrorCode.NOT_READY, f"the runtime did not answer health: {err.message}",
                            trace_id=err.trace_id) from None
        trace = [body.get("trace_id", "")]
        if not body.get("ready"):
            raise HttpError(503, ErrorCode.NOT_READY, f"the runtime is not ready (state {body.get('state')})",
                            trace_id=trace[0])
        return self._json({"status": "ok", "runtime": body.get("state")}, trace)

    async def prometheus(self, request: web.Request) -> web.Response:
        text = self.metrics.render(len(self.server.connections) if self.server is not None else 0,
                                   self.pool.in_flight())
        return web.Response(body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
