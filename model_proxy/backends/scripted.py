"""A backend that replays a script of assistant turns, for tests and offline demos.

Each turn is either text (tokenised with the model's tokenizer, then the end-of-turn ID appended unless
``"eot": false``) or exact ``token_ids`` (to test non-canonical tokenisations). Log-probabilities are
deterministic: a hash of (prompt length, position, token ID) mapped into [-5, -0.01], so two runs of the same
script record the same numbers.

Scripts are replayed per session: calls are keyed by ``GenerationRequest.affinity_key`` (the proxy passes the
session id), and every key replays its own script from the start, so concurrent sessions do not steal each
other's turns. :meth:`ScriptedBackend.from_sessions` gives each session its own script; a backend built with a
single script gives every session a copy of it. A retried attempt (``<id>~attemptN``) replays its own script if
it has one, else its session's from the start. Running out of turns raises
:class:`~model_proxy.errors.ScriptExhausted`: a script shorter than the conversation is a test bug.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from model_proxy.errors import MalformedRequest, ScriptExhausted
from model_proxy.models import GenerationChunk, GenerationRequest
from polar_core.errors import FailedPrecondition

# A retried attempt's proxy session id is ``<session id>~attempt<N>`` (gateway.models.proxy_session_id).
_RETRIED_ATTEMPT = re.compile(r"~attempt[0-9]+$")

__all__ = ["ScriptTurn", "ScriptedBackend", "TextEncoder", "load_script", "scripted_logprob"]

_LOGPROB_MIN = -5.0
_LOGPROB_MAX = -0.01


class TextEncoder(Protocol):
    """The part of a Hugging Face tokenizer the scripted backend uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Return the token IDs of ``text``."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class ScriptTurn:
    """One scripted assistant turn.

    Exactly one of ``text`` and ``token_ids`` is set.

    Attributes:
        text: Text tokenised with the model tokenizer (no special tokens added).
        token_ids: Sampled IDs given exactly; no end-of-turn ID is appended.
        eot: Whether to append the end-of-turn ID to a ``text`` turn.
        finish_reason: Reported when the turn is replayed whole (``max_tokens`` may still cut it: ``length``).
    """

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    eot: bool = True
    finish_reason: str = "stop"

    def __post_init__(self) -> None:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("a script turn has exactly one of 'text' and 'token_ids'")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ScriptTurn:
        """Build a turn from its JSON form (``{"text": ...}`` or ``{"token_ids": [...]}``).

        Raises:
            ValueError: The object has unknown keys or the wrong types.
        """
        unknown = set(raw) - {"text", "token_ids", "eot", "finish_reason"}
        if unknown:
            raise ValueError(f"unknown script turn keys: {sorted(unknown)}")
        text = raw.get("text")
        ids = raw.get("token_ids")
        if text is not None and not isinstance(text, str):
            raise ValueError("script turn 'text' must be a string")
        if ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids)):
            raise ValueError("script turn 'token_ids' must be a list of integers")
        return cls(
            text=text,
            token_ids=tuple(ids) if ids is not None else None,
            eot=bool(raw.get("eot", True)),
            finish_reason=str(raw.get("finish_reason", "stop")),
        )


def load_script(path: str | Path) -> list[ScriptTurn]:
    """Read a script file: a JSON list of turns, or JSON Lines with one turn per line.

    Args:
        path: The script file.

    Returns:
        The turns in order.

    Raises:
        ValueError: The file is neither a JSON list nor JSON Lines of turn objects.
    """
    text = Path(path).read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        raw = json.loads(stripped)
        if not isinstance(raw, list):
            raise ValueError(f"{path}: expected a JSON list of turns")
    else:
        raw = [json.loads(line) for line in text.splitlines() if line.strip()]
    turns: list[ScriptTurn] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValueError(f"{path}: turn {index} is not a JSON object")
        try:
            turns.append(ScriptTurn.from_dict(item))
        except ValueError as exc:
            raise ValueError(f"{path}: turn {index}: {exc}") from exc
    return turns


def scripted_logprob(prompt_length: int, position: int, token_id: int) -> float:
    """Return the deterministic log-probability the scripted backend reports for one sampled token.

    Args:
        prompt_length: Number of prompt tokens of the call.
        position: Index of the token within the response.
        token_id: The sampled ID.

    Returns:
        A value in [-5, -0.01], stable across processes and Python versions.
    """
    digest = hashlib.blake2b(f"{prompt_length}:{position}:{token_id}".encode(), digest_size=8).digest()
    fraction = int.from_bytes(digest, "big") / float(1 << 64)
    return round(_LOGPROB_MIN + fraction * (_LOGPROB_MAX - _LOGPROB_MIN), 6)


class ScriptedBackend:
    """Replays scripted turns as if a model had sampled them.

    Attributes:
        name: ``"scripted"``.
        requests: The requests received, in arrival order (for assertions in tests): the last
            ``kept_requests`` only, so a long-running scripted proxy (benchmarks) does not keep every prompt.
    """

    name = "scripted"
    kept_requests = 256

    def __init__(
        self,
        turns: Sequence[ScriptTurn],
        tokenizer: TextEncoder | None,
        *,
        end_of_turn_id: int,
        sessions: Mapping[str, Sequence[ScriptTurn]] | None = None,
        chunk_size: int = 4,
    ) -> None:
        """Create the backend and tokenise every turn up front, so a bad script fails at once.

        Args:
            turns: The default script; each new affinity key replays a copy from its start. Empty with
                ``sessions`` set means unknown sessions are refused.
            tokenizer: Tokenises ``text`` turns; may be None when every turn gives ``token_ids``.
            end_of_turn_id: Appended to ``text`` turns (unless ``eot`` is false).
            sessions: Scripts of particular sessions, keyed by affinity key.
            chunk_size: Tokens per chunk when the request asks for a stream.

        Raises:
            ValueError: A ``text`` turn with no tokenizer, or a chunk size below 1.
        """
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self._tokenizer = tokenizer
        self._end_of_turn_id = end_of_turn_id
        self._chunk_size = chunk_size
        self._default = [self._render(turn) for turn in turns]
        self._sessions = {key: [self._render(t) for t in script] for key, script in (sessions or {}).items()}
        self._cursors: dict[str, int] = {}
        self.requests: list[GenerationRequest] = []

    @classmethod
    def from_sessions(
        cls,
        sessions: Mapping[str, Sequence[ScriptTurn]],
        tokenizer: TextEncoder | None,
        *,
        end_of_turn_id: int,
        default: Sequence[ScriptTurn] = (),
        chunk_size: int = 4,
    ) -> ScriptedBackend:
        """Create a backend whose sessions (affinity keys) each replay their own script.

        Args:
            sessions: Script per affinity key.
            tokenizer: Tokenises ``text`` turns.
            end_of_turn_id: Appended to ``text`` turns.
            default: Script for keys not in ``sessions``; empty refuses them with ``ScriptExhausted``.
            chunk_size: Tokens per chunk when streaming.

        Returns:
            The backend.
        """
        return cls(default, tokenizer, end_of_turn_id=end_of_turn_id, sessions=sessions, chunk_size=chunk_size)

    def _render(self, turn: ScriptTurn) -> tuple[tuple[int, ...], str]:
        if turn.token_ids is not None:
            return turn.token_ids, turn.finish_reason
        if self._tokenizer is None:
            raise ValueError("a text script turn needs a tokenizer")
        assert turn.text is not None
        ids = list(self._tokenizer.encode(turn.text, add_special_tokens=False))
        if turn.eot:
            ids.append(self._end_of_turn_id)
        return tuple(ids), turn.finish_reason

    def remaining(self, affinity_key: str = "") -> int:
        """Return how many turns the session keyed ``affinity_key`` has left."""
        return len(self._script_of(affinity_key)) - self._cursors.get(affinity_key, 0)

    def _script_of(self, key: str) -> list[tuple[tuple[int, ...], str]]:
        """The script of ``key``; a retried attempt (``<id>~attemptN``) without its own replays its session's."""
        if key in self._sessions:
            return self._sessions[key]
        return self._sessions.get(_RETRIED_ATTEMPT.sub("", key), self._default)

    def _next_turn(self, request: GenerationRequest) -> tuple[tuple[int, ...], str]:
        key = request.affinity_key
        script = self._script_of(key)
        cursor = self._cursors.get(key, 0)
        if cursor >= len(script):
            raise ScriptExhausted(
                f"scripted backend: session {key!r} has no turn left (script has {len(script)} turns)",
                details={"affinity_key": key, "turns": str(len(script))},
            )
        self._cursors[key] = cursor + 1
        return script[cursor]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Replay the session's next turn.

        The turn is cut after the first ID in ``request.stop_token_ids`` (finish ``stop``) and at
        ``max_tokens`` (finish ``length``); a cut turn is still consumed.

        Raises:
            ScriptExhausted: The session has no turn left.
            MalformedRequest: ``max_tokens`` is below 1.
        """
        # Take the turn before the first await so concurrent calls of one session get distinct turns.
        self.requests.append(request)
        if len(self.requests) > self.kept_requests:
            del self.requests[: len(self.requests) - self.kept_requests]
        ids, finish = self._next_turn(request)
        max_tokens = request.sampling.max_tokens
        if max_tokens is not None and max_tokens < 1:
            raise MalformedRequest(f"max_tokens must be at least 1, got {max_tokens}")
        stops = set(request.stop_token_ids)
        for index, token in enumerate(ids):
            if token in stops:
                ids, finish = ids[: index + 1], "stop"
                break
        if max_tokens is not None and len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        prompt_length = len(request.prompt_token_ids)
        logprobs = tuple(scripted_logprob(prompt_length, i, t) for i, t in enumerate(ids))
        step = self._chunk_size if request.stream else max(len(ids), 1)
        starts = list(range(0, len(ids), step)) or [0]
        for n, start in enumerate(starts):
            last = n == len(starts) - 1
            yield GenerationChunk(
                token_ids=ids[start : start + step],
                logprobs=logprobs[start : start + step],
                finish_reason=finish if last else None,
            )

    async def start(self) -> None:
        """Nothing to start."""

    async def close(self) -> None:
        """Nothing to release."""

    async def check_weights(self, path: str) -> str:
        """Accept any existing directory: a script has no weights, only the version changes."""
        if not await asyncio.to_thread(Path(path).is_dir):
            raise FailedPrecondition(f"weights path {path!r} is not a directory")
        return ""

    async def load_weights(self, path: str) -> None:
        """Nothing to load (see :meth:`check_weights`)."""
        await self.check_weights(path)

    async def healthy(self) -> bool:
        """Always ready."""
        return True
