"""scripts/patch_opencode.py: the shell-tool patch keeps the executable's length, applies once, refuses other builds."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

_REPO = Path(__file__).resolve().parents[3]
_INSTALLED = _REPO / ".harnesses" / "node_modules" / "opencode-ai" / "bin" / "opencode.exe"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("patch_opencode", _REPO / "scripts" / "patch_opencode.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


po = _load()

_NOTES = (
    b"'# Windows PowerShell (5.1) shell notes\\n- Use `cmd1; if ($?) { cmd2 }` to chain dependent commands."
    b"\\n- Use `$(...)` for subexpressions. Use `@(...)` for array expressions."
    b'\\n- Escape special characters with the PowerShell backtick character.\';return""}'
)
_BUNDLE = (
    b"\x00ELF...let D=yield*e.spawn(x);yield*s.forkScoped(Go.runForEach(Go.decodeText(D.all),(A)=>{O.push(A)}));"
    b'let Z=yield*s.raceAll([a,b]);return Z.kind==="exit"?Z.code:null})...' + _NOTES + b"...\x00"
)


def test_the_patch_keeps_the_length_and_joins_the_output_fiber() -> None:
    out = po.patch(_BUNDLE)
    assert len(out) == len(_BUNDLE)
    assert b"let $pq=yield*s.forkScoped(Go.runForEach(Go.decodeText(D.all)," in out
    assert po._WAIT + b'return Z.kind==="exit"?Z.code:null' in out
    # The bytes come from the two Windows-PowerShell-only bullets; the first bullet and the rest stay.
    assert b"array expressions" not in out
    assert b"backtick character" not in out
    assert b"to chain dependent commands.'" in out
    assert out.endswith(b';return""}...\x00')


def test_patching_twice_changes_nothing() -> None:
    once = po.patch(_BUNDLE)
    assert po.patch(once) == once


@pytest.mark.parametrize(
    ("bundle", "error"),
    [
        # code changed
        (_BUNDLE.replace(b"yield*s.forkScoped(Go.runForEach", b"yield*s.forkDaemon(Go.runForEach"), "found it 0"),
        (_BUNDLE + _BUNDLE, "found it 2"),  # the text twice: not the one build this patch knows
        (_BUNDLE.replace(b"backtick character", b"backtick"), "not in the Windows"),  # no bytes to give back
        (_BUNDLE.replace(b"...\x00", b"$pq\x00"), "already used"),  # the name the patch would use is taken
    ],
    ids=["changed", "twice", "notes", "name-taken"],
)
def test_another_build_is_refused(bundle: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        po.patch(bundle)


def test_patch_file_renames_a_new_file_over_the_old(tmp_path: Path) -> None:
    exe = tmp_path / "opencode"
    exe.write_bytes(_BUNDLE)
    exe.chmod(0o755)
    inode = exe.stat().st_ino
    assert po.patch_file(exe) is True
    assert exe.stat().st_ino != inode  # a hard link to the old file (bin/opencode.exe) would keep the old text
    assert exe.stat().st_mode & 0o777 == 0o755
    assert po.patch_file(exe) is False


@pytest.mark.skipif(not _INSTALLED.exists(), reason="opencode not installed (bash scripts/setup_harnesses.sh opencode)")
def test_the_installed_opencode_is_patched() -> None:
    data = _INSTALLED.read_bytes()
    assert data.count(po._WAIT) == 1
    assert po.patch(data) == data
