"""Unit tests of the scripted backend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn, load_script, scripted_logprob
from model_proxy.errors import ScriptExhausted
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams
from polar_core.model_fixtures.tokenizer import build_tiny_tokenizer

EOT = 7


class _CharTokenizer:
    """Tokenises each character as its code point, so expected IDs are obvious."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def _request(*, key: str = "", stream: bool = False, max_tokens: int | None = 100, prompt=(1, 2, 3)):
    return GenerationRequest(
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=max_tokens),
        stop_token_ids=(EOT,),
        request_id="r",
        affinity_key=key,
        stream=stream,
    )


async def _collect(backend: ScriptedBackend, request: GenerationRequest) -> list[GenerationChunk]:
    return [chunk async for chunk in backend.generate(request)]


def _joined(chunks: list[GenerationChunk]) -> tuple[list[int], list[float], str | None]:
    ids = [t for c in chunks for t in c.token_ids]
    lps = [p for c in chunks for p in c.logprobs]
    return ids, lps, chunks[-1].finish_reason


async def test_text_turn_appends_end_of_turn_and_token_turn_is_exact() -> None:
    backend = ScriptedBackend(
        [ScriptTurn(text="hi"), ScriptTurn(token_ids=(104, 105)), ScriptTurn(text="x", eot=False)],
        _CharTokenizer(),
        end_of_turn_id=EOT,
    )
    assert _joined(await _collect(backend, _request()))[0] == [104, 105, EOT]
    assert _joined(await _collect(backend, _request()))[0] == [104, 105]
    ids, _, finish = _joined(await _collect(backend, _request()))
    assert ids == [120]
    assert finish == "stop"
    with pytest.raises(ScriptExhausted):
        await _collect(backend, _request())


async def test_logprobs_are_deterministic_and_in_range() -> None:
    turns = [ScriptTurn(text="hello world")]
    a = ScriptedBackend(turns, _CharTokenizer(), end_of_turn_id=EOT)
    b = ScriptedBackend(turns, _CharTokenizer(), end_of_turn_id=EOT)
    ids_a, lps_a, _ = _joined(await _collect(a, _request()))
    ids_b, lps_b, _ = _joined(await _collect(b, _request()))
    assert ids_a == ids_b
    assert lps_a == lps_b
    assert len(lps_a) == len(ids_a)
    assert all(-5.0 <= lp <= -0.01 for lp in lps_a)
    assert lps_a[0] == scripted_logprob(3, 0, ids_a[0])
    assert scripted_logprob(3, 0, 5) != scripted_logprob(4, 0, 5)


async def test_max_tokens_cuts_with_length() -> None:
    backend = ScriptedBackend([ScriptTurn(text="abcdef")], _CharTokenizer(), end_of_turn_id=EOT)
    ids, lps, finish = _joined(await _collect(backend, _request(max_tokens=3)))
    assert ids == [97, 98, 99]
    assert len(lps) == 3
    assert finish == "length"


async def test_stop_id_inside_turn_cuts_with_stop() -> None:
    backend = ScriptedBackend([ScriptTurn(token_ids=(1, EOT, 2, 3))], None, end_of_turn_id=EOT)
    ids, _, finish = _joined(await _collect(backend, _request()))
    assert ids == [1, EOT]
    assert finish == "stop"


async def test_streams_in_several_chunks() -> None:
    backend = ScriptedBackend([ScriptTurn(text="abcdefghij")], _CharTokenizer(), end_of_turn_id=EOT, chunk_size=3)
    chunks = await _collect(backend, _request(stream=True))
    assert [len(c.token_ids) for c in chunks] == [3, 3, 3, 2]
    assert [c.finish_reason for c in chunks] == [None, None, None, "stop"]
    assert _joined(chunks)[0] == [*range(97, 107), EOT]


async def test_each_session_replays_the_default_script_from_its_start() -> None:
    backend = ScriptedBackend([ScriptTurn(text="a"), ScriptTurn(text="b")], _CharTokenizer(), end_of_turn_id=EOT)
    results = await asyncio.gather(*[_collect(backend, _request(key=k)) for k in ("s1", "s2", "s1", "s2")])
    firsts = sorted(_joined(r)[0][0] for r in results)
    assert firsts == [97, 97, 98, 98]
    assert backend.remaining("s1") == 0
    assert backend.remaining("s3") == 2
    with pytest.raises(ScriptExhausted, match="s1"):
        await _collect(backend, _request(key="s1"))


async def test_from_sessions_gives_each_session_its_script_and_refuses_unknown() -> None:
    backend = ScriptedBackend.from_sessions(
        {"s1": [ScriptTurn(token_ids=(1,))], "s2": [ScriptTurn(token_ids=(2,))]}, None, end_of_turn_id=EOT
    )
    assert _joined(await _collect(backend, _request(key="s2")))[0] == [2]
    assert _joined(await _collect(backend, _request(key="s1")))[0] == [1]
    with pytest.raises(ScriptExhausted):
        await _collect(backend, _request(key="other"))
    assert len(backend.requests) == 3


async def test_a_retried_attempt_replays_its_sessions_script_unless_it_has_its_own() -> None:
    backend = ScriptedBackend.from_sessions(
        {"s1": [ScriptTurn(token_ids=(1,)), ScriptTurn(token_ids=(2,))], "s2~attempt2": [ScriptTurn(token_ids=(5,))]},
        None,
        end_of_turn_id=EOT,
    )
    assert _joined(await _collect(backend, _request(key="s1")))[0] == [1]
    # The retry starts over: its own cursor, the session's script from the first turn.
    assert _joined(await _collect(backend, _request(key="s1~attempt3")))[0] == [1]
    assert backend.remaining("s1~attempt3") == 1
    assert backend.remaining("s1") == 1
    assert _joined(await _collect(backend, _request(key="s2~attempt2")))[0] == [5]
    with pytest.raises(ScriptExhausted):
        await _collect(backend, _request(key="s2"))
    with pytest.raises(ScriptExhausted):  # only an attempt suffix is stripped
        await _collect(backend, _request(key="s1~attemptx"))


def test_load_script_reads_json_list_and_jsonl(tmp_path: Path) -> None:
    turns = [{"text": "hi"}, {"token_ids": [1, 2]}, {"text": "x", "eot": False}]
    as_list = tmp_path / "script.json"
    as_list.write_text(json.dumps(turns))
    as_lines = tmp_path / "script.jsonl"
    as_lines.write_text("\n".join(json.dumps(t) for t in turns) + "\n\n")
    expected = [ScriptTurn(text="hi"), ScriptTurn(token_ids=(1, 2)), ScriptTurn(text="x", eot=False)]
    assert load_script(as_list) == expected
    assert load_script(as_lines) == expected


@pytest.mark.parametrize("bad", [[{"text": "a", "token_ids": [1]}], [{}], [{"txt": "a"}], [{"token_ids": ["1"]}], [3]])
def test_load_script_rejects_bad_turns(tmp_path: Path, bad: list[object]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="turn 0"):
        load_script(path)


def test_text_turn_without_tokenizer_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        ScriptedBackend([ScriptTurn(text="a")], None, end_of_turn_id=EOT)


async def test_real_tokenizer_round_trips_text() -> None:
    tokenizer = build_tiny_tokenizer()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(eot, int)
    backend = ScriptedBackend([ScriptTurn(text="The tests passed.")], tokenizer, end_of_turn_id=eot)
    ids, _, _ = _joined(await _collect(backend, _request()))
    assert ids[-1] == eot
    assert tokenizer.decode(ids[:-1]) == "The tests passed."
