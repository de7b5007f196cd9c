"""The ``command`` evaluator of the sum task: a shaped reward for pi's final answer to "What is 7 + 5?".

pi runs with ``--session-dir .pi-sessions`` (a harness ``extra_args``), so its session transcript is a new file
in the workspace; the agent's patch carries it here, and the answer is the text of its last assistant
message. The reward (from the research prototype's probe of SmolLM2-135M-Instruct, which answers about a
third of the time with 12 among other text):

    0.0                           no integer in the answer
    max(0, 1 - |n - 12| / 10)     n the first integer of the answer: closeness to the right sum
    halved unless the answer is only the number ("12" beats "the answer is 12")

It is honest (a function of what the model answered, nothing else) and graded, so a group has spread before
any sample is exactly right.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ANSWER = 12


def number_reward(text: str, answer: int = ANSWER) -> float:
    """Closeness of the first integer of ``text`` to ``answer``, halved unless ``text`` is only that number."""
    match = re.search(r"-?\d+", text)
    if match is None:
        return 0.0
    closeness = max(0.0, 1.0 - abs(int(match.group()) - answer) / 10.0)
    only = re.fullmatch(r"\s*-?\d+\s*\.?\s*", text) is not None
    return closeness * (1.0 if only else 0.5)


def final_answer(workspace: Path) -> str:
    """The text of the last assistant message in pi's session transcripts ("" when there is none)."""
    text = ""
    for path in sorted(workspace.glob(".pi-sessions/**/*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            message = entry.get("message") if isinstance(entry, dict) else None
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            parts = message.get("content")
            if isinstance(parts, str):
                text = parts
            elif isinstance(parts, list):
                text = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")
    return text


def main() -> None:
    answer = final_answer(Path.cwd())
    reward = number_reward(answer)
    out = Path(os.environ["POLAR_REWARD_FILE"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"reward": reward, "resolved": reward == 1.0}), encoding="utf-8")


if __name__ == "__main__":
    main()
