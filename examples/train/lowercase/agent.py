"""The ``command``-harness agent of the lowercase task: one chat completion through the proxy, reply to a file.

It uses the official ``openai`` SDK, which reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from the
environment the command harness provides (the proxy's OpenAI endpoint and the session token). The sampling
seed is derived from the session id (``POLAR_SESSION_ID``: the rollout server names sessions after their task
and sample index), so a run with the same task ids samples the same way.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

from openai import OpenAI


def main() -> int:
    workspace = Path(os.environ["POLAR_WORKSPACE"])
    seed = zlib.crc32(os.environ["POLAR_SESSION_ID"].encode()) & 0x7FFFFFFF
    client = OpenAI(timeout=120.0, max_retries=2)  # OPENAI_BASE_URL / OPENAI_API_KEY from the harness
    reply = client.chat.completions.create(
        model=os.environ["POLAR_MODEL"],
        messages=[{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}],
        max_tokens=int(os.environ.get("AGENT_MAX_TOKENS", "32")),
        temperature=1.0,
        seed=seed,
    )
    text = reply.choices[0].message.content or ""
    (workspace / "reply.txt").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
