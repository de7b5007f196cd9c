"""The ``command`` evaluator of the lowercase task: the shaped reward of the agent's reply, to reward.json.

reward = (lowercase ASCII letters a-z in the reply) / (characters in the reply); 0.0 for an empty or missing
reply. It is honest (a pure function of what the model wrote, nothing the agent could game but writing
lowercase letters) and shaped (every reply gets a graded score, so a group of samples has spread from the
first step on, which is what group-relative advantages need). The session counts as resolved when the
reply is non-empty and at least 90% lowercase.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

LOWER = frozenset(string.ascii_lowercase)
RESOLVED_AT = 0.9


def lowercase_share(text: str) -> float:
    """Share of the characters of ``text`` that are a-z (0.0 for an empty text)."""
    return sum(c in LOWER for c in text) / len(text) if text else 0.0


def main() -> None:
    reply = Path(os.environ["POLAR_ARTIFACTS_DIR"]) / "reply.txt"
    text = reply.read_text(encoding="utf-8", errors="replace") if reply.is_file() else ""
    reward = lowercase_share(text)
    out = Path(os.environ["POLAR_REWARD_FILE"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"reward": reward, "resolved": bool(text) and reward >= RESOLVED_AT}), encoding="utf-8")


if __name__ == "__main__":
    main()
