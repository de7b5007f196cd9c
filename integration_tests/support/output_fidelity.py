"""Known command outputs and each agent's own rules for showing them to the model, for the output-fidelity test.

:func:`known_output` makes deterministic, printable text whose every line names itself (a tag, its number and
a hash of both), so any cut, reorder or rewrite is visible. :func:`check_shown` finds the tool result for one
output in the next model call's recorded request and checks it against the agent's rules (:data:`RULES`):

* every piece of the output that reaches the model is a verbatim slice of it, in order, and every gap between,
  before or after the slices sits exactly where the agent's own truncation notice stands (so nothing is lost
  silently); where the notice states how much it left out, the statement is checked against the real gap;
* where the rule is short enough to restate, the whole tool result is rebuilt from the output and compared
  exactly (which bytes kept, which notice, which numbers).

The rules were read from each agent's bundled code at the pinned versions (``gateway/harnesses/npm``,
``gateway/harnesses/python``) and confirmed by running it; ``docs/harnesses.md`` ("How long tool outputs
reach the model") lists them with the measured figures.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["RULES", "Rule", "check_shown", "known_output"]

_WORDS = tuple(
    [
        "alpha",
        "bravo",
        "charlie",
        "delta",
        "echo",
        "foxtrot",
        "golf",
        "hotel",
        "india",
        "juliet",
        "kilo",
        "lima",
        "mike",
        "november",
        "oscar",
        "papa",
        "quebec",
        "romeo",
        "sierra",
        "tango",
        "uniform",
        "victor",
        "whiskey",
        "xray",
        "yankee",
        "zulu",
    ]
)


def known_output(size: int, tag: str) -> str:
    """At least ``size`` bytes of numbered ASCII lines, each ``TAG NNNNNN words... HASH8\\n``, ending in a newline."""
    lines: list[str] = []
    total = 0
    while total < size:
        number = len(lines) + 1
        digest = hashlib.sha256(f"{tag}:{number}".encode()).digest()
        words = " ".join(_WORDS[b % len(_WORDS)] for b in digest[: 6 + digest[6] % 6])
        line = f"{tag} {number:06d} {words} {digest.hex()[:8]}\n"
        lines.append(line)
        total += len(line)
    return "".join(lines)


# Given the output and the tool result the model got, the tool result the agent's rules make (None: whole or
# checked by the slices alone).
Exact = Callable[[str, str], str | None]


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one agent shows a command's output to the model.

    Attributes:
        region: A pattern whose group ``out`` is the part of the tool result that holds the output (the rest is
            the agent's own framing: exit status, working directory, ...).
        notices: The agent's truncation notices; a group ``omitted`` is the number of characters it says it left
            out, checked against the real gap (within ``slack``).
        exact: Rebuilds the whole expected tool result, where the rule is simple enough to restate.
        strips: The agent trims trailing whitespace (the output's final newline) from what it shows.
        slack: How far a stated ``omitted`` may differ from the real gap (separators the agent adds or counts).
    """

    region: str = r"(?P<out>.*)"
    notices: tuple[str, ...] = ()
    exact: Exact | None = None
    strips: bool = False
    slack: int = 0


def _kb(size: int) -> str:
    return f"{size / 1024:.1f}KB"


def _claude_code(output: str, shown: str) -> str | None:
    # Bash results over 30,000 characters (maxResultSizeChars) are saved to a file; the model gets the first
    # 2,000 characters cut back to their last newline (when that keeps more than half) and the file's path.
    text = output.rstrip("\n")
    if len(text) <= 30_000:
        return text
    path = re.search(r"Full output saved to: (\S+)\n", shown)
    newline = text[:2000].rfind("\n")
    preview = text[: newline if newline > 1000 else 2000]
    return (
        f"<persisted-output>\nOutput too large ({_kb(len(text))}). Full output saved to: {path and path[1]}\n\n"
        f"Preview (first 2KB):\n{preview}\n...\n</persisted-output>"
    )


def _codex(output: str, shown: str) -> str | None:
    # exec_command keeps 10,000 bytes (this model's byte budget): the first and last 5,000, with the count of
    # characters between them, after the line count and an estimate of 4 bytes a token.
    if len(output.encode()) <= 10_000:
        return None
    header = re.match(r"Chunk ID: \w+\nWall time: [0-9.]+ seconds\nProcess exited with code 0\n", shown)
    tokens = math.ceil(len(output.encode()) / 4)
    return (
        f"{header and header[0]}Original token count: {tokens}\nOutput:\n"
        f"Warning: truncated output (original token count: {tokens})\n"
        f"Total output lines: {len(output.splitlines())}\n\n"
        f"{output[:5000]}…{len(output) - 10_000} chars truncated…{output[-5000:]}"
    )


def _last_lines(lines: list[str], max_lines: int = 2000, max_bytes: int = 51_200) -> list[str] | None:
    """The whole lines pi and opencode keep (the last ``max_lines`` or ``max_bytes``); ``None`` when all fit."""
    if len(lines) <= max_lines and len("\n".join(lines).encode()) <= max_bytes:
        return None
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        add = len(line.encode()) + (1 if kept else 0)
        if len(kept) == max_lines or size + add > max_bytes:
            break
        kept.insert(0, line)
        size += add
    return kept


def _pi(output: str, shown: str) -> str | None:
    # The bash tool keeps the last 2,000 lines or 50 KB (51,200 bytes), whole lines only, and names the temp
    # file holding all of it.
    lines = output.split("\n")
    kept = _last_lines(lines)
    if kept is None:
        return output
    by = "" if len(kept) == 2000 else " (50.0KB limit)"
    path = re.search(r"Full output: (\S+)\]$", shown)
    first = len(lines) - len(kept) + 1
    notice = f"[Showing lines {first}-{len(lines)} of {len(lines)}{by}. Full output: {path and path[1]}]"
    return "\n".join(kept) + "\n\n" + notice


def _opencode(output: str, shown: str) -> str | None:
    # The bash tool keeps the last 2,000 lines or 50 KB, whole lines, and names the file holding all of it. It
    # cuts what it still holds: the chunks it read, of which it keeps only the newest up to twice its byte limit
    # (102,400 bytes, dropping whole chunks from the front). When dropping one leaves less than 50 KB, that rest
    # is shown whole, from wherever the chunk began (mid-line): a shorter tail, still the output's end, still
    # behind the notice. Where the chunks fall depends on how the pipe was read, so either form is opencode's.
    kept = _last_lines(output.split("\n"))
    if kept is None:
        return output
    path = re.search(r"Full output saved to: (\S+)\n", shown)
    head = f"...output truncated...\n\nFull output saved to: {path and path[1]}\n\n"
    tail = "\n".join(kept)
    body = shown.removeprefix(head)
    if body != shown and len(body) < len(tail) and body and output.endswith(body):
        return head + body  # the shorter tail of opencode's chunk ring
    return head + tail


def _gemini_cli(output: str, shown: str) -> str | None:
    # The shell result (output plus process group, inside <untrusted_context>) over 40,000 characters keeps its
    # first 8,000 and last 32,000 characters around the count of those left out, and names the saved file.
    pgid = re.search(r"Process Group PGID: (\d+)\n</untrusted_context>$", shown)
    content = f"<untrusted_context>\nOutput: {output}Process Group PGID: {pgid and pgid[1]}\n</untrusted_context>"
    if len(content) <= 40_000:
        return content
    path = re.search(r"For full output see: (\S+)\n", shown)
    return (
        f"Output too large. Showing first 8,000 and last 32,000 characters. For full output see: {path and path[1]}\n"
        f"{content[:8000]}\n\n... [{len(content) - 40_000:,} characters omitted] ...\n\n{content[-32_000:]}"
    )


def _cline(output: str, shown: str) -> str | None:
    # Two cuts, both Cline's own. The shell tool keeps 48,000 characters: the first and last 24,000 around a line
    # naming the total. Its message builder then keeps any tool result to 8,000 characters: head and tail around
    # the count of characters between them. Over 48,000 the second cut takes the first one's notice with the
    # middle, so the model reads a count of what the second cut removed (~40,000), not of what the output lost.
    if len(output) > 48_000:
        notice = (
            f"\n[... output truncated: {len(output)} chars total. "
            "Refine the command (grep, head, tail) to view the elided middle ...]\n"
        )
        output = output[:24_000] + notice + output[-24_000:]
    return _cline_middle(output, 8000)


def _cline_middle(text: str, limit: int) -> str:
    # The message builder's middle cut: the notice for a first guess of the count sizes head and tail, then the
    # notice for the count that guess gives is the one shown, with head and tail resized to fit it.
    if len(text) <= limit:
        return text
    first = f"\n\n...[truncated {len(text) - limit} chars]...\n\n"
    guess = max(0, (limit - len(first)) // 2)
    notice = f"\n\n...[truncated {max(0, len(text) - 2 * guess)} chars]...\n\n"
    keep = max(0, (limit - len(notice)) // 2)
    return text[:keep] + notice + (text[-keep:] if keep else "")


def _continue(output: str, shown: str) -> str | None:
    # The Bash tool keeps the last 1,000 lines, then the last 50,000 characters of those (from the first newline
    # within the first 1,000 of them), after a line with what it removed.
    lines = output.split("\n")
    if len(lines) > 1000:
        removed = len(lines) - 1000
        kept = "\n".join(lines[-1000:])
        if len(kept) <= 50_000:
            return f"(previous {removed} lines truncated)\n\n{kept}"
        return _continue_tail(kept, removed)
    return _continue_tail(output, 0) if len(output) > 50_000 else output


def _continue_tail(text: str, removed_lines: int) -> str:
    tail = text[len(text) - 50_000 :]
    newline = tail.find("\n")
    tail = tail[newline + 1 :] if -1 < newline < 1000 else tail
    chars = len(text) - len(tail)
    if removed_lines:
        return f"(previous output truncated: {removed_lines} lines and {chars} characters removed)\n\n{tail}"
    return f"(previous {chars} characters truncated)\n\n{tail}"


def _openai_agents(output: str, shown: str) -> str | None:
    # Polar's own program (gateway/harnesses/programs/openai_agents_agent.py): the last 20,000 characters.
    if len(output) <= 20_000:
        return f"exit code: 0\n{output}"
    notice = f"[output truncated: the first {len(output) - 20_000} of {len(output)} characters are not shown]"
    return f"exit code: 0\n{notice}\n{output[-20_000:]}"


def _mini_swe_agent(output: str, shown: str) -> str | None:
    # mini.yaml's observation template: under 10,000 characters whole, else the first and last 5,000 characters
    # and the number elided between them.
    if len(output) < 10_000:
        return json.dumps({"returncode": 0, "output": output})
    fields = {"output_head": output[:5000], "output_tail": output[-5000:], "elided_chars": len(output) - 10_000}
    return json.dumps({"returncode": 0, **fields, "warning": "Output too long."})


# The agent's result, as text it shows or as the JSON document it shows, normalised for comparison.
def _as_json(shown: str) -> str:
    return json.dumps(json.loads(shown))


RULES: dict[str, Rule] = {
    "claude-code": Rule(exact=_claude_code, strips=True),
    "codex": Rule(region=r"Output:\n(?P<out>.*)$", exact=_codex, notices=(r"…(?P<omitted>\d+) chars truncated…",)),
    "qwen-code": Rule(
        region=r"Output: (?P<out>.*)Error: \(none\)\nExit Code: 0\n",
        notices=(r"(?:\.\.\.)?\n\n---\n\.\.\. \[CONTENT TRUNCATED\] \.\.\.\n---\n\n(?:\.\.\.)?",),
    ),
    "pi": Rule(exact=_pi),
    "gemini-cli": Rule(exact=_gemini_cli),
    "opencode": Rule(exact=_opencode),
    "cline": Rule(exact=_cline),
    "continue": Rule(exact=_continue),
    "mini-swe-agent": Rule(exact=_mini_swe_agent),
    "aider": Rule(region=r"And got this output:\n\n(?P<out>.*?\n)\n"),
    "openai-agents": Rule(exact=_openai_agents),
    "openhands": Rule(
        region=r"^(?P<out>.*)\[The command completed with exit code 0\.\]",
        notices=(
            r"\[Previous command outputs are truncated\. Showing the last \d+ lines of the output below\.\]\n",
            r"<response clipped><NOTE>Due to the max output limit, only part of the full response has been shown "
            r"to you\. The complete output has been saved to \S+ - you can use other tools to view the full "
            r"content \(truncated part starts around line \d+\)\.</NOTE>",
        ),
    ),
    "hermes-agent": Rule(
        notices=(
            r"\n\n\.\.\. \[OUTPUT TRUNCATED - (?P<omitted>[\d,]+) chars omitted out of [\d,]+ total\] \.\.\.\n\n",
        ),
        strips=True,
        # The total also counts the agent's end-of-command marker, removed after the cut; the omitted count
        # matched the gap exactly when measured, the slack allows for the marker's length.
        slack=200,
    ),
}


def _strings(value: Any) -> Iterator[str]:
    """Every string in a request, and, for strings holding a JSON document, the strings inside it instead."""
    if isinstance(value, str):
        if value[:1] in "[{":
            try:
                inner = json.loads(value)
            except ValueError:
                inner = None
            if isinstance(inner, dict | list):
                yield from _strings(inner)
                return
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _tool_results(request: Any, output: str) -> list[str]:
    """The strings of ``request`` that carry ``output`` (its first line's tag and number are in them).

    Usually one; aider sends a failing test command's output twice (the chat's record of it, then the same
    message with its format reminder as the newest turn).
    """
    tag = output[: output.index(" ")]
    if "output_head" in json.dumps(request) and tag in json.dumps(request):
        # mini-swe-agent's observation is a JSON document; compare it as one.
        found = [s for s in _raw_strings(request) if f'"output_head": "{tag}' in s or f'"output": "{tag}' in s]
    else:
        found = [s for s in _strings(request) if re.search(rf"(^|\n|\W){re.escape(tag)} \d{{6}} ", s)]
    assert found, f"no tool result with the output tagged {tag!r} in the request"
    return list(dict.fromkeys(found))


def _raw_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _raw_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _raw_strings(item)


def _check_slices(region: str, output: str, rule: Rule) -> list[tuple[int, int]]:
    """Check that ``region`` is slices of ``output`` in order, every gap marked by a notice; return the gaps."""
    target = output.rstrip("\n") if rule.strips else output
    notices = [m for pattern in rule.notices for m in re.finditer(pattern, region, re.DOTALL)]
    notices.sort(key=lambda m: m.start())
    pieces: list[tuple[str, re.Match[str] | None, re.Match[str] | None]] = []
    cursor = 0
    before: re.Match[str] | None = None
    for notice in [*notices, None]:
        end = notice.start() if notice else len(region)
        pieces.append((region[cursor:end], before, notice))
        cursor, before = (notice.end(), notice) if notice else (cursor, before)
    gaps: list[tuple[int, int]] = []
    at = 0
    last_notice: re.Match[str] | None = None
    for piece, notice_before, notice_after in pieces:
        if not piece:
            continue
        found = target.find(piece, at)
        assert found >= 0, f"shown text not in the output at or after byte {at}: {piece[:200]!r}...{piece[-200:]!r}"
        if found > at:
            assert notice_before is not None, f"bytes {at}-{found} of the output were dropped without a notice"
            gaps.append((at, found))
            _check_count(notice_before, found - at, rule)
        at = found + len(piece)
        last_notice = notice_after
    if at < len(target):
        assert last_notice is not None, f"the output's bytes {at}-{len(target)} were dropped silently"
        gaps.append((at, len(target)))
    return gaps


def _check_count(notice: re.Match[str], gap: int, rule: Rule) -> None:
    stated = notice.groupdict().get("omitted")
    if stated is not None:
        said = int(stated.replace(",", ""))
        assert abs(said - gap) <= rule.slack, f"the notice says {said} characters left out; {gap} were"


def check_shown(harness: str, request: Any, output: str) -> str:
    """Check how ``harness`` showed ``output`` in the next call's ``request``; return a one-line summary."""
    return "; ".join(_check_one(harness, shown, output) for shown in _tool_results(request, output))


def _check_one(harness: str, shown: str, output: str) -> str:
    rule = RULES[harness]
    if rule.exact is not None:
        expected = rule.exact(output, shown)
        if expected is not None:
            actual = _as_json(shown) if harness == "mini-swe-agent" else shown
            if actual != expected:
                cut = next((i for i, (a, b) in enumerate(zip(actual, expected, strict=False)) if a != b), None)
                raise AssertionError(
                    f"{harness}: tool result differs from its rules at {cut} (len {len(actual)} vs {len(expected)}):"
                    f"\nshown:    {actual[(cut or 0) - 100 : (cut or 0) + 200]!r}"
                    f"\nexpected: {expected[(cut or 0) - 100 : (cut or 0) + 200]!r}"
                )
            # The rule rebuilt the whole result, notice and all: nothing more to learn from its slices.
            return f"{len(output)} B output -> {len(shown)} B tool result, exactly as its rules make it"
    region = re.search(rule.region, shown, re.DOTALL)
    assert region is not None, f"{harness}: no output region in {shown[:300]!r}...{shown[-300:]!r}"
    gaps = _check_slices(region["out"], output, rule)
    lost = sum(b - a for a, b in gaps)
    return f"{len(output)} B output -> {len(shown)} B tool result, {lost} B left out behind {len(gaps)} notice(s)"
