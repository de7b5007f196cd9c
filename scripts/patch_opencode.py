"""Patch opencode 1.18.33's shell tool so it waits for the command's output before building the result.

opencode's shell tool (packages/opencode/src/tool/shell.ts, bundled into the Bun executable as plain
JavaScript) consumes the command's output in a fiber forked into the command's scope, then closes that scope as
soon as the exit code arrives. Closing it interrupts the fiber while output still waits in its stream buffers:
on a 1 MB ``cat`` under load the model was shown the last 50 KB of the first ~300 KB, behind opencode's own
"output truncated" notice (upstream issues anomalyco/opencode#36795 and #35511; the fix, PR #36796, was closed
unmerged and 1.18.33 is the latest release).

The patch does what that PR does: keep the fiber and, when the command exited, wait for it to finish (the
output stream ends when every writer has closed it) before the scope closes, at most 5 s: a guard only, since
opencode's exit code already waits for the output to close (a background process holding it open delays the
result as much before the patch as after). The executable's embedded sources have fixed offsets, so the
patch keeps the length: the bytes it adds are taken from the "Windows PowerShell (5.1) shell notes" (two of
its six bullets), text opencode only shows when its shell is Windows PowerShell.

Idempotent; refuses any other build (the replaced text must occur exactly once). Usage:
``python3 scripts/patch_opencode.py EXECUTABLE...``
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The consumer fiber, kept in a name the bundle never uses.
_FORK = b"yield*s.forkScoped(Go.runForEach(Go.decodeText(D.all),"
_FORK_PATCHED = b"let $pq=yield*s.forkScoped(Go.runForEach(Go.decodeText(D.all),"
# After the race between exit, abort and timeout: on exit, wait (at most 5 s) for the consumer to finish.
_RETURN = b'return Z.kind==="exit"?Z.code:null'
_WAIT = b'if(Z.kind==="exit")yield*s.raceAll([s.callback((r)=>{$pq.addObserver(()=>r(s.void))}),s.sleep(5e3)]);'
_RETURN_PATCHED = _WAIT + _RETURN
# Two bullets of the Windows PowerShell (5.1) notes give the bytes back.
_PS51 = b"'# Windows PowerShell (5.1) shell notes"
_BULLETS = (
    b"\\n- Use `$(...)` for subexpressions. Use `@(...)` for array expressions.",
    b"\\n- Escape special characters with the PowerShell backtick character.",
)
_MARK = b"let $pq="


def patch(data: bytes) -> bytes:
    """Return ``data`` patched (the same length); raise ValueError on a build this patch does not know."""
    if data.count(_MARK) == 1 and data.count(_RETURN_PATCHED) == 1:
        return data  # already patched
    for needle in (_FORK, _RETURN, _PS51):
        if data.count(needle) != 1:
            raise ValueError(
                f"expected {needle[:40]!r} once, found it {data.count(needle)} times: not opencode 1.18.33"
            )
    if b"$pq" in data:
        raise ValueError("the name $pq is already used in this build")
    added = len(_FORK_PATCHED) - len(_FORK) + len(_RETURN_PATCHED) - len(_RETURN)
    start = data.index(_PS51)
    end = data.index(b"';", start)
    notes = data[start:end]
    for bullet in _BULLETS:
        if notes.count(bullet) != 1:
            raise ValueError(f"bullet {bullet[:40]!r} not in the Windows PowerShell notes")
        notes = notes.replace(bullet, b"")
    freed = (end - start) - len(notes)
    if freed < added:
        raise ValueError(f"the notes free {freed} bytes, the patch needs {added}")
    # What is freed beyond what the patch adds becomes spaces after the string (outside it: no visible change).
    out = data[:start] + notes + b"'" + b" " * (freed - added) + data[end + 1 :]
    out = out.replace(_FORK, _FORK_PATCHED).replace(_RETURN, _RETURN_PATCHED)
    assert len(out) == len(data)
    return out


def patch_file(path: Path) -> bool:
    """Patch ``path`` in place (through a new file renamed over it); True when it changed."""
    data = path.read_bytes()
    out = patch(data)
    if out == data:
        return False
    tmp = path.with_name(path.name + ".patching")
    tmp.write_bytes(out)
    os.chmod(tmp, path.stat().st_mode)
    tmp.replace(path)
    return True


def main(argv: list[str]) -> int:
    for name in argv:
        try:
            changed = patch_file(Path(name))
        except ValueError as exc:
            print(f"patch_opencode: {name}: {exc}", file=sys.stderr)
            return 1
        print(f"patch_opencode: {name}: {'patched' if changed else 'already patched'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
