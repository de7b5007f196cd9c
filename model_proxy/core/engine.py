"""The call pipeline shared by every protocol: normalise, render, check, gate, generate, parse, record.

:meth:`ProxyEngine.start_call` does everything that can fail with a clean HTTP error *before* a response
starts: it renders and tokenises the prompt, checks the context length, waits at the generation gate and
pulls the backend's first chunk. The returned :class:`Call` then yields output deltas and finally a
:class:`~model_proxy.core.events.CallResult`, after the completion record is durable. Streaming and
non-streaming answers consume the same events, so their captured IDs, logprobs and parsed output agree.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import NoOpMeterProvider

from model_proxy.core.events import CallResult, OutputEvent
from model_proxy.core.gate import GenerationGate
from model_proxy.core.normalize import NormalizationRule, apply_rules
from model_proxy.core.parsing import IncrementalDecoder, OutputParser, StopTrimmer, TokenDecoder
from model_proxy.core.render import ChatRenderer, RenderedPrompt
from model_proxy.core.sessions import Session, SessionRegistry
from model_proxy.errors import BackendTimeout, ContextLengthExceeded, GenerationAborted
from model_proxy.metrics import CallMeasurement, ProxyMetrics
from model_proxy.models import EngineConfig, GenerationChunk, GenerationRequest, InternalRequest, SamplingParams
from model_proxy.ports import Backend
from polar_core.errors import Internal, PolarError
from polar_core.records import CompletionRecord

__all__ = ["Call", "ProxyEngine"]

_log = logging.getLogger(__name__)


class ProxyEngine:
    """Runs model calls for sessions and records them."""

    def __init__(
        self,
        *,
        backend: Backend,
        tokenizer: TokenDecoder,
        renderer: ChatRenderer,
        parser: OutputParser,
        rules: Sequence[NormalizationRule],
        registry: SessionRegistry,
        config: EngineConfig,
        policy_version: str,
        tracer: trace.Tracer | None = None,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.parser = parser
        self.rules = list(rules)
        self.registry = registry
        self.config = config
        self.gate = GenerationGate()
        self.policy_version = policy_version
        self.tracer = tracer or trace.get_tracer("model_proxy")
        self.metrics = metrics or ProxyMetrics(NoOpMeterProvider())
        self._background: set[asyncio.Task[Any]] = set()

    def prepare(
        self, session: Session, request: InternalRequest, call_id: str, *, token_limit: int = 0
    ) -> tuple[RenderedPrompt, list[str]]:
        """Normalise and render a request; returns the prompt and the rules that fired.

        Args:
            session: The calling session (its prefix cache is used and extended).
            request: The translated request.
            call_id: The new call's id (remembered by the prefix cache).
            token_limit: When set, a prompt that certainly has this many tokens or more is refused before it is
                tokenised (:meth:`ChatRenderer.check_fits`).

        Raises:
            ContextLengthExceeded: The precheck proved the prompt too long.
        """
        fired = apply_rules(self.rules, request)
        renderer = self.renderer
        return renderer.render(request.messages, request.tools, session.cache, call_id, token_limit=token_limit), fired

    async def prepare_async(
        self, session: Session, request: InternalRequest, call_id: str, *, offload: bool
    ) -> tuple[RenderedPrompt, list[str]]:
        """:meth:`prepare` under the session's render lock, in a worker thread when ``offload``.

        The lock keeps two calls of one session from using its prefix cache at once. A worker thread is not
        interrupted by a caller that goes away: the lock is released when the thread has finished.
        """
        limit = self.config.context_length
        lock = session.render_lock
        await lock.acquire()
        if not offload:
            try:
                return self.prepare(session, request, call_id, token_limit=limit)
            finally:
                lock.release()
        work = asyncio.ensure_future(asyncio.to_thread(self.prepare, session, request, call_id, token_limit=limit))

        def done(task: asyncio.Future[tuple[RenderedPrompt, list[str]]]) -> None:
            lock.release()
            if not task.cancelled():
                task.exception()  # retrieved here when the caller went away

        work.add_done_callback(done)
        return await asyncio.shield(work)

    async def count_tokens(self, request: InternalRequest, *, offload: bool = False) -> int:
        """Number of prompt tokens ``request`` renders to (no session cache, nothing recorded).

        ``offload`` renders and tokenises in a worker thread (a large request).
        """

        def count() -> int:
            apply_rules(self.rules, request)
            text = self.renderer.render_text(request.messages, request.tools)
            return len(self.renderer.tokenize(text, None).token_ids)

        return await asyncio.to_thread(count) if offload else count()

    async def start_call(
        self,
        session: Session,
        request: InternalRequest,
        *,
        trace_context: Context | None = None,
        offload: bool = False,
    ) -> Call:
        """Start a call; returns once the backend produced its first chunk.

        Args:
            session: The calling session.
            request: The translated request.
            trace_context: The parent of the call's span.
            offload: Render and tokenise in a worker thread (a large request: the event loop stays free).

        Raises:
            ContextLengthExceeded: The prompt leaves no room in the model's context (refused before it is
                tokenised in full when a cheap lower bound already proves it).
            PolarError: Backend errors (unavailable, overloaded, timeout) before the first chunk.
        """
        started_at = time.time()
        arrived = time.perf_counter()
        call_id = "call_" + secrets.token_hex(12)
        try:
            rendered, fired = await self.prepare_async(session, request, call_id, offload=offload)
            sampling = self._sampling(request, len(rendered.token_ids))
        except Exception as exc:
            self.metrics.call_failed(request.protocol, exc, duration_s=time.perf_counter() - arrived)
            raise
        n_prompt = len(rendered.token_ids)
        span = self.tracer.start_span(
            f"chat {request.model}",
            context=trace_context,
            kind=trace.SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.system": "polar",
                "gen_ai.request.model": request.model,
                "gen_ai.request.max_tokens": sampling.max_tokens or 0,
                "gen_ai.request.temperature": sampling.temperature,
                "polar.protocol": request.protocol,
                "polar.session_id": session.session_id,
                "polar.call_id": call_id,
                "gen_ai.usage.input_tokens": n_prompt,
                "polar.prompt_tokens_reused": rendered.reused_tokens,
            },
        )
        call = Call(self, session, request, rendered, fired, sampling, call_id, started_at, span)
        call.arrived = arrived
        SessionRegistry.call_started(session)
        try:
            await call.start()
        except BaseException as exc:
            if isinstance(exc, Exception):
                self.metrics.call_failed(request.protocol, exc, duration_s=time.perf_counter() - arrived)
            call.cleanup()
            span.record_exception(exc)
            span.end()
            raise
        return call

    def _sampling(self, request: InternalRequest, n_prompt: int) -> SamplingParams:
        """The request's sampling with ``max_tokens`` fitted to the room the prompt leaves in the context.

        Raises:
            ContextLengthExceeded: The prompt leaves no room.
        """
        limit = self.config.context_length
        if n_prompt >= limit:
            raise ContextLengthExceeded(n_prompt, limit)
        room = limit - n_prompt
        wanted = request.sampling.max_tokens or self.config.default_max_tokens or room
        return dataclasses.replace(request.sampling, max_tokens=min(wanted, room))

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a reference to a background task until it ends."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)


_ABORT = None


class Call:
    """One running model call."""

    def __init__(
        self,
        engine: ProxyEngine,
        session: Session,
        request: InternalRequest,
        rendered: RenderedPrompt,
        fired: list[str],
        sampling: SamplingParams,
        call_id: str,
        started_at: float,
        span: trace.Span,
    ) -> None:
        self.engine = engine
        self.session = session
        self.request = request
        self.rendered = rendered
        self.fired = fired
        self.sampling = sampling
        self.call_id = call_id
        self.started_at = started_at
        self.span = span
        self.policy_version = ""
        self._queue: asyncio.Queue[GenerationChunk | BaseException | None] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._ticket: int | None = None
        self._first: GenerationChunk | None = None
        self._cleaned = False
        self._committed = False
        self._cut = False
        self.arrived = time.perf_counter()
        self._sent = self._first_at = self._ended = 0.0
        self._write_s: float | None = None
        self._outcome: tuple[str, BaseException | None] | None = None

    @property
    def prompt_tokens(self) -> int:
        """Number of prompt tokens."""
        return len(self.rendered.token_ids)

    async def start(self) -> None:
        """Enter the gate, stamp the policy version, start the backend and wait for its first chunk."""
        self._ticket = await self.engine.gate.enter(self.cut)
        self.policy_version = self.engine.policy_version
        gen = GenerationRequest(
            prompt_token_ids=self.rendered.token_ids,  # shared, not copied: nothing changes it
            sampling=self.sampling,
            stop_token_ids=self.engine.config.stop_token_ids,
            request_id=self.call_id,
            affinity_key=self.session.session_id,
            stream=self.request.stream,
        )
        self._sent = time.perf_counter()
        self._pump = asyncio.create_task(self._run_backend(gen))
        first = await self._queue.get()
        self._first_at = time.perf_counter()
        if isinstance(first, BaseException):
            raise first
        if first is None:
            first = GenerationChunk((), (), "abort")
        self._first = first

    async def _run_backend(self, gen: GenerationRequest) -> None:
        try:
            async with asyncio.timeout(self.engine.config.backend_timeout_s):
                async for chunk in self.engine.backend.generate(gen):
                    self._queue.put_nowait(chunk)
                    if chunk.finish_reason is not None:
                        return
            self._queue.put_nowait(GenerationChunk((), (), "stop"))
        except asyncio.CancelledError:
            self._queue.put_nowait(_ABORT)
        except TimeoutError:
            timeout = BackendTimeout(f"the backend did not finish within {self.engine.config.backend_timeout_s:g} s")
            self.engine.metrics.backend_error(self.engine.backend.name, timeout)
            self._queue.put_nowait(timeout)
        except PolarError as exc:
            self.engine.metrics.backend_error(self.engine.backend.name, exc)
            self._queue.put_nowait(exc)
        except Exception as exc:
            _log.exception("backend %s failed", self.engine.backend.name)
            failure = Internal(f"backend failure: {type(exc).__name__}")
            self.engine.metrics.backend_error(self.engine.backend.name, failure)
            self._queue.put_nowait(failure)

    @property
    def was_cut(self) -> bool:
        """Whether a pause with ``abort_in_flight`` cut this call (it then ends in :class:`GenerationAborted`)."""
        return self._cut

    def cut(self) -> None:
        """Abort for a weight update: the record says ``abort`` and the harness gets a retryable error.

        A call whose backend already finished is left alone (it ends normally).
        """
        if self._pump is not None and not self._pump.done():
            self._cut = True
            self._pump.cancel()

    def abort(self) -> None:
        """Stop sampling; the call ends with ``finish_reason`` ``abort`` and what was sampled so far."""
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()

    async def events(self) -> AsyncIterator[OutputEvent | CallResult]:
        """Yield output deltas, then the :class:`CallResult` (after the record is durable)."""
        engine = self.engine
        decoder = IncrementalDecoder(engine.tokenizer)
        trimmer = StopTrimmer(self.sampling.stop)
        stream = engine.parser.stream(lambda i: f"{self.call_id}_{i}")
        ids: list[int] = []
        logprobs: list[float] = []
        finish = "abort"
        try:
            item: GenerationChunk | BaseException | None = self._first
            self._first = None
            while True:
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                ids.extend(item.token_ids)
                logprobs.extend(item.logprobs)
                text = trimmer.feed(decoder.feed(item.token_ids))
                for event in stream.feed(text) if text else ():
                    yield event
                if item.finish_reason is not None:
                    finish = item.finish_reason
                    break
                item = await self._queue.get()
            tail = trimmer.feed(decoder.flush()) + trimmer.flush()
            for event in [*stream.feed(tail), *stream.finish()]:
                yield event
            parsed = stream.result()
            if parsed.tool_calls and finish == "stop":
                finish = "tool_calls"
            result = await self._commit(ids, logprobs, finish, parsed, trimmer.matched)
            self._outcome = ("aborted" if finish == "abort" else "ok", None)
            if self._cut and finish == "abort":
                raise GenerationAborted("generation was cut by a policy update; retry the request")
            yield result
        except Exception as exc:
            if self._outcome is None:
                self._outcome = ("error", exc)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away: what was sampled is still recorded, as an aborted call.
            self._outcome = self._outcome or ("aborted", None)
            if not self._committed:
                self.abort()
                parsed = stream.result()
                task = asyncio.ensure_future(self._commit(ids, logprobs, "abort", parsed, None))
                engine.keep(task)
            raise
        finally:
            if self._pump is not None and not self._pump.done():
                self._pump.cancel()
            self._measure(len(ids))
            self.cleanup()

    def _measure(self, output_tokens: int) -> None:
        """Record the call's outcome, latency and tokens once, however it ended.

        The recording (a few microseconds per instrument in the OpenTelemetry SDK) is deferred to the event
        loop's next turn, so the answer is on its way before it runs; with metrics off nothing is done.
        """
        metrics = self.engine.metrics
        if not metrics.enabled:
            return
        status, error = self._outcome or ("aborted", None)
        now = time.perf_counter()
        if error is not None:
            metrics.call_failed(self.request.protocol, error, duration_s=now - self.arrived)
            return
        end = self._ended or now
        measured = CallMeasurement(
            protocol=self.request.protocol,
            status=status,
            duration_s=now - self.arrived,
            ttft_s=self._first_at - self.arrived,
            prompt_tokens=len(self.rendered.token_ids),
            output_tokens=output_tokens,
            backend_s=end - self._sent,
            decode_s=end - self._first_at,
            record_write_s=self._write_s,
            backend=self.engine.backend.name,
        )
        try:
            asyncio.get_running_loop().call_soon(metrics.call_finished, measured)
        except RuntimeError:  # finalised outside the event loop (interpreter shutdown): record it now
            metrics.call_finished(measured)

    async def collect(self) -> CallResult:
        """Run the call to the end and return its result."""
        async for item in self.events():
            if isinstance(item, CallResult):
                return item
        raise Internal("call ended without a result")

    async def _commit(
        self,
        ids: list[int],
        logprobs: list[float],
        finish: str,
        parsed: Any,
        stop_sequence: str | None,
    ) -> CallResult:
        self._committed = True
        self._ended = time.perf_counter()  # the backend's last chunk is in: decoding ended, recording begins
        if len(logprobs) != len(ids):
            raise Internal(f"backend returned {len(ids)} token IDs but {len(logprobs)} logprobs")
        record = self._record(ids, logprobs, finish, parsed, stop_sequence)
        alone = self.engine.gate.in_flight <= 1  # this call is the only one between the gate and its answer
        task = asyncio.ensure_future(
            self.engine.registry.append(self.session, record, prompt_ids_json=self.rendered.token_ids_json, alone=alone)
        )
        self.engine.keep(task)
        await asyncio.shield(task)
        self._write_s = time.perf_counter() - self._ended
        self.span.set_attribute("gen_ai.usage.output_tokens", len(ids))
        self.span.set_attribute("gen_ai.response.finish_reasons", [finish])
        return CallResult(
            call_id=self.call_id,
            model=self.request.model,
            parsed=parsed,
            finish_reason=finish,
            stop_sequence=stop_sequence,
            prompt_tokens=len(self.rendered.token_ids),
            completion_tokens=len(ids),
            record=record,
        )

    def _record(
        self, ids: list[int], logprobs: list[float], finish: str, parsed: Any, stop_sequence: str | None
    ) -> CompletionRecord:
        req = self.request
        return CompletionRecord(
            session_id=self.session.session_id,
            call_id=self.call_id,
            seq=-1,
            prompt_token_ids=self.rendered.token_ids,  # shared with the prefix cache (neither changes it)
            response_token_ids=ids,
            response_logprobs=logprobs,
            protocol=req.protocol,
            model=req.model,
            policy_version=self.policy_version,
            parent_call_id=self.rendered.parent_call_id,
            finish_reason=finish,
            request={
                "model": req.model,
                "messages": self.rendered.message_dicts or [m.to_template_dict() for m in req.messages],
                "tools": self.rendered.tool_dicts
                if self.rendered.tool_dicts is not None
                else [t.to_template_dict() for t in req.tools],
                "tool_choice": req.tool_choice,
                **req.normalized,
            },
            response={
                "text": parsed.text,
                "reasoning": parsed.reasoning,
                "tool_calls": [dataclasses.asdict(c) for c in parsed.tool_calls],
                "stop_sequence": stop_sequence,
            },
            started_at=self.started_at,
            ended_at=time.time(),
            extra={
                "normalization_rules_fired": list(self.fired),
                "tool_call_parse_error": parsed.tool_call_parse_error,
                "sampling": self.sampling.to_dict(),
                "backend": self.engine.backend.name,
                "replica": "",
            },
        )

    def discard(self) -> None:
        """Free a call whose answer is never read (its stream never started): stop sampling and leave.

        A call whose events ran already cleaned up (and recorded itself); then this does nothing. A stream that
        never started sent the harness nothing, and nothing is recorded for it.
        """
        if not self._cleaned:
            self.abort()
            self._measure(0)
            self.cleanup()

    def cleanup(self) -> None:
        """Leave the gate and the session's in-flight count (idempotent)."""
        if self._cleaned:
            return
        self._cleaned = True
        if self._ticket is not None:
            self.engine.gate.leave(self._ticket)
        SessionRegistry.call_finished(self.session)
        self.span.end()
