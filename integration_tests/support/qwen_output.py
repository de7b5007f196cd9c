"""Known command output for Qwen Code's shell tool, and what became of it in the next recorded prompt.

Shared by ``integration_tests/test_harness_qwen_output.py`` and ``bench/qwen_shell_output``. A run writes files of
known bytes into the sandbox's ``HOME`` (``home_files`` of :func:`integration_tests.support.harnesses.run_harness`),
the scripted model ``cat``\\ s them through ``run_shell_command``, and :func:`classify` reads the tool result the
CLI sent back in the following request.

Qwen Code's own rules (0.24.4): the result is ``Command: ...\\nDirectory: ...\\nOutput: <stdout, then stderr,
ANSI-stripped and trimmed>\\nError: ...\\nExit Code: ...``; a result over 30,000 characters is replaced by a
notice ("Tool output was too large and has been truncated. The full output has been saved to: PATH ..."), a
~4,000-character preview of its beginning and end around ``... [CONTENT TRUNCATED] ...``, and PATH holds the
whole result (``truncateToolOutput`` with ``keep: "both"``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CAP_NOTICE", "Outcome", "classify", "file_name", "known_bytes", "tool_result_text"]

CAP_NOTICE = "Tool output was too large and has been truncated"
_SAVED_TO = re.compile(r"The full output has been saved to: (\S+)")
_PREVIEW = "Truncated part of the output:\n"
_CUT = "\n\n---\n... [CONTENT TRUNCATED] ...\n---\n\n"
_LINE_TAIL = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:54]


class Outcome(enum.StrEnum):
    """What the model was shown of one command's output."""

    WHOLE = "whole"  # every byte, in the result itself
    CAPPED = "capped"  # Qwen Code's own notice and preview, with the whole result in the file it names
    TRUNCATED = "truncated"  # some bytes, silently, or a notice whose file or preview does not hold the output
    EMPTY = "empty"  # "Output: (empty)"


def known_bytes(size: int) -> str:
    """``size`` bytes of numbered 64-byte lines (printable ASCII), ending in a non-blank character.

    Every line is different, so a cut shows where it happened; the last character is never whitespace because
    Qwen Code trims the output.
    """
    lines = (f"L{i:07d}-{_LINE_TAIL}\n" for i in range(size // 64 + 1))
    text = "".join(lines)[:size]
    return text[:-1] + "." if text[-1:].isspace() else text


def file_name(size: int, copy: int = 0) -> str:
    """A file under HOME holding :func:`known_bytes` of ``size`` (numbered copies give distinct commands)."""
    return f"out-{size}.txt" if copy == 0 else f"out-{size}-{copy}.txt"


def tool_result_text(request: Mapping[str, Any]) -> str:
    """The text of the last ``tool`` message of a recorded Chat Completions request (Qwen sends a list of parts)."""
    for message in reversed(request.get("messages") or []):
        if message.get("role") != "tool":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") for part in content or [] if isinstance(part, Mapping))
    raise AssertionError("the request holds no tool message")


def classify(text: str, expected: str, sandbox_root: Path | None = None) -> Outcome:
    """What ``text``, a shell tool result, shows of the command output ``expected``.

    ``sandbox_root`` is the host directory under which the sandbox's paths lie (the local runtime keeps host
    paths, so ``None`` reads the named file as is); a capped result counts as :attr:`Outcome.CAPPED` only when
    that file holds the whole output and the preview is the result's true beginning and end.
    """
    if f"Output: {expected}\nError:" in text:
        return Outcome.WHOLE
    if text.startswith(CAP_NOTICE):
        return Outcome.CAPPED if _cap_holds(text, expected, sandbox_root) else Outcome.TRUNCATED
    if "Output: (empty)\n" in text:
        return Outcome.EMPTY
    return Outcome.TRUNCATED


def _cap_holds(text: str, expected: str, sandbox_root: Path | None) -> bool:
    saved = _SAVED_TO.search(text)
    if saved is None or _PREVIEW not in text:
        return False
    path = Path(saved.group(1))
    if sandbox_root is not None:
        path = sandbox_root / path.relative_to("/")
    try:
        whole = path.read_text()
    except OSError:
        return False
    if f"Output: {expected}\nError:" not in whole:
        return False
    preview = text.split(_PREVIEW, 1)[1]
    if _CUT not in preview:
        return False
    head, tail = preview.split(_CUT, 1)
    # A line cut at the preview's edge ends (head) or starts (tail) with "...".
    head = head.removesuffix("...")
    tail = tail.removeprefix("...")
    return whole.startswith(head) and whole.endswith(tail) and len(head) > 0 and len(tail) > 0
