from __future__ import annotations

from pathlib import Path

import pytest

from polar_core.model_fixtures import IM_END, build_tiny_tokenizer
from polar_core.records import CompletionRecord
from reconstructor.eot import detect_end_of_turn_ids, end_of_turn_ids_from_tokenizer
from reconstructor.errors import EndOfTurnUnknown


def rec(i: int, response: list[int], finish: str = "stop") -> CompletionRecord:
    return CompletionRecord(
        session_id="s",
        call_id=f"c{i}",
        seq=i,
        prompt_token_ids=[1],
        response_token_ids=response,
        response_logprobs=[0.0] * len(response),
        finish_reason=finish,
    )


def test_detection_takes_the_majority_last_token_of_finished_responses():
    records = [rec(0, [5, 9]), rec(1, [6, 9]), rec(2, [7, 3]), rec(3, [8, 4], finish="length")]
    assert detect_end_of_turn_ids(records) == (9,)


def test_detection_refuses_without_a_majority():
    assert detect_end_of_turn_ids([rec(0, [5, 9]), rec(1, [6, 8]), rec(2, [6, 7])]) == ()
    assert detect_end_of_turn_ids([rec(0, [5], finish="length")]) == ()


def test_tokenizer_directory_names_its_template_terminator(tmp_path: Path):
    tokenizer = build_tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    assert end_of_turn_ids_from_tokenizer(tmp_path) == (tokenizer.convert_tokens_to_ids(IM_END),)
    assert end_of_turn_ids_from_tokenizer(tmp_path / "tokenizer.json") == (tokenizer.convert_tokens_to_ids(IM_END),)


def test_missing_tokenizer_is_reported(tmp_path: Path):
    with pytest.raises(EndOfTurnUnknown):
        end_of_turn_ids_from_tokenizer(tmp_path)
