"""The ``command`` evaluator of the lowercase task: the shaped reward of the agent's reply, to reward.json.

reward = (characters a-z among the first 48 characters of the reply) / 48; 0.0 for an empty or missing
reply. It is honest (a pure function of what the model wrote: only writing lowercase letters earns it) and
shaped (every reply gets a graded score, so a group of samples has spread from the first step on, which is
what group-relative advantages need). The fixed denominator means stopping early never pays: with the plain
share ``lowercase / len(reply)`` a one-letter reply scores 1.0 and GRPO learns to stop at once. 32 tokens of
the tiny model are about 90 characters, so 48 is reachable. Resolved: a reward of at least 0.9.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

LOWER = frozenset(string.ascii_lowercase)
WIDTH = 48
RESOLVED_AT = 0.9


def lowercase_prefix(text: str, width: int = WIDTH) -> float:
    """Share of the first ``width`` character slots of ``text`` that hold a-z (missing characters count 0)."""
    return sum(c in LOWER for c in text[:width]) / width


def main() -> None:
    reply = Path(os.environ["POLAR_ARTIFACTS_DIR"]) / "reply.txt"
    text = reply.read_text(encoding="utf-8", errors="replace") if reply.is_file() else ""
    reward = lowercase_prefix(text)
    out = Path(os.environ["POLAR_REWARD_FILE"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"reward": reward, "resolved": reward >= RESOLVED_AT}), encoding="utf-8")


if __name__ == "__main__":
    main()
