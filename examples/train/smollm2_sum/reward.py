"""The ``command`` evaluator of the sum task: a shaped reward for pi's final answer to "What is a + b?".

pi runs with ``--session-dir .pi-sessions`` (a harness ``extra_args``), so its session transcript is a new file
in the workspace; the agent's patch carries it here. The question is the transcript's first user message
(the trainer gives every step its own sum), the answer the text of its last assistant message. The reward:

    0.0                           no question or no integer in the answer
    max(0, 1 - |n - (a+b)| / 10)  n the LAST integer of the answer ("7 + 5 equals 12." ends with the sum)
    halved unless the answer is only the number ("12" beats "the answer is 12")

It is honest (a function of the question and of what the model answered, nothing else) and graded in two
ways, closeness and format, so a group of SmolLM2-135M-Instruct's answers has spread before any is exactly
right (its chatty "... equals 12." replies earn 0.5; the bare number 1.0).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

QUESTION = re.compile(r"What is (-?\d+) \+ (-?\d+)\?")


def number_reward(text: str, answer: int) -> float:
    """Closeness of the last integer of ``text`` to ``answer``, halved unless ``text`` is only that number."""
    numbers = re.findall(r"-?\d+", text)
    if not numbers:
        return 0.0
    closeness = max(0.0, 1.0 - abs(int(numbers[-1]) - answer) / 10.0)
    only = re.fullmatch(r"\s*-?\d+\s*\.?\s*", text) is not None
    return closeness * (1.0 if only else 0.5)


def _text(message: dict[str, object]) -> str:
    parts = message.get("content")
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list):
        return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text")
    return ""


def transcript(workspace: Path) -> tuple[str, str]:
    """The first user message and the last assistant message of pi's session transcripts ("" when absent)."""
    question = answer = ""
    for path in sorted(workspace.glob(".pi-sessions/**/*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            message = entry.get("message") if isinstance(entry, dict) else None
            if not isinstance(message, dict):
                continue
            if message.get("role") == "user" and not question:
                question = _text(message)
            elif message.get("role") == "assistant":
                answer = _text(message)
    return question, answer


def score(workspace: Path) -> float:
    """The reward of the session whose workspace (with the agent's patch applied) is ``workspace``."""
    question, answer = transcript(workspace)
    match = QUESTION.search(question)
    if match is None:
        return 0.0
    return number_reward(answer, int(match.group(1)) + int(match.group(2)))


def main() -> None:
    reward = score(Path.cwd())
    out = Path(os.environ["POLAR_REWARD_FILE"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"reward": reward, "resolved": reward == 1.0}), encoding="utf-8")


if __name__ == "__main__":
    main()
