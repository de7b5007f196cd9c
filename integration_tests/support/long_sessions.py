"""Long sessions through the embedded stack: a command-harness agent whose context grows with every call.

The agent (the OpenAI Python SDK, as a real harness uses it) makes ``calls`` chat calls, appending each reply
and a pseudo-random "tool output" of ``tool_bytes`` bytes to its messages, so the prompt of call ``i`` holds
about ``i * tool_bytes`` tokens (the tiny tokenizer is byte-level). The proxy runs the tiny tokenizer with the
scripted backend; its context length allows the last prompt. Used by ``test_long_sessions.py`` and
``bench.long_sessions``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from polar.common.v1 import reconstruction_pb2, task_pb2

from polar_run.embedded import StackOptions

__all__ = ["AGENT", "long_task", "stack_options"]

AGENT = """
import hashlib, os, sys
from openai import OpenAI
calls, tool_bytes = int(sys.argv[1]), int(sys.argv[2])
client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0,
                timeout=300)
messages = [{"role": "user", "content": "Fix the failing test."}]
for i in range(calls):
    reply = client.chat.completions.create(model=os.environ["POLAR_MODEL"], messages=messages, max_tokens=64)
    messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    seed = hashlib.sha256(f"{i}".encode()).hexdigest()
    noise = "".join(hashlib.sha256(f"{seed}{j}".encode()).hexdigest() for j in range(tool_bytes // 64 + 1))
    messages.append({"role": "user", "content": f"tool output {i}:\\n" + noise[:tool_bytes]})
open("answer.txt", "w").write("done\\n")
"""

_STRATEGIES = {
    "per_request": reconstruction_pb2.RECONSTRUCTION_STRATEGY_PER_REQUEST,
    "prefix_merge": reconstruction_pb2.RECONSTRUCTION_STRATEGY_PREFIX_MERGE,
    "exact": reconstruction_pb2.RECONSTRUCTION_STRATEGY_EXACT,
}


def stack_options(state_dir: Path, script: Path, *, calls: int, tool_bytes: int, workers: int = 4) -> StackOptions:
    """Embedded-stack options for sessions of ``calls`` calls growing by ``tool_bytes`` each.

    ``script`` is written with ``calls`` scripted turns (every session replays it from its start).
    """
    script.write_text("\n".join(f'{{"text": "Step {i}: I ran the tool."}}' for i in range(calls)) + "\n")
    context = 1024 + calls * (tool_bytes + 256)
    return StackOptions(
        state_dir=state_dir,
        model="tiny",
        backend="scripted",
        backend_options={"script": str(script)},
        context_length=context,
        running_workers=workers,
        init_workers=2,
        postrun_workers=2,
        max_attempts=1,
        session_grace_s=600.0,
    )


def long_task(
    task_id: str, *, calls: int, tool_bytes: int, samples: int = 1, strategy: str = "per_request"
) -> task_pb2.Task:
    """A task whose sessions each run :data:`AGENT` for ``calls`` calls (``strategy`` reconstructs them)."""
    task = task_pb2.Task(
        task_id=task_id,
        instruction="Fix the failing test.",
        num_samples=samples,
        timeout_seconds=900.0,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        builder=task_pb2.BuilderSpec(strategy=_STRATEGIES[strategy]),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
    )
    task.harness.options.update({"argv": [sys.executable, "-c", AGENT, str(calls), str(tool_bytes)]})
    return task
