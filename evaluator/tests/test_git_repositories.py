"""The swe strategy on a git repository with history: the patch is applied to base_commit's tree, clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from evaluator import Artifacts, EvaluatorService, EvaluatorSettings, EvaluatorSpec, PrepareParams
from evaluator.app import evaluator_config
from polar_core.errors import InvalidArgument
from polar_core.records import TerminalStatus
from polar_core.testing import HistoryRepo, make_history_repo


@pytest.fixture
def repo(tmp_path: Path) -> HistoryRepo:
    return make_history_repo(tmp_path / "repo")


@pytest.fixture
async def service(tmp_path: Path):
    settings = EvaluatorSettings(state_dir=tmp_path / "state", local_isolation="none", min_isolation="none")
    svc = EvaluatorService(evaluator_config(settings))
    yield svc
    await svc.close()


def _spec(repo: HistoryRepo, **options: object) -> EvaluatorSpec:
    return EvaluatorSpec(
        "swe",
        {"repo": str(repo.path), "fail_to_pass": ["tests/test_calc.py::test_add"],
         "pass_to_pass": ["tests/test_calc.py::test_zero"], **options},
    )  # fmt: skip


async def _evaluate(svc: EvaluatorService, spec: EvaluatorSpec, patch: str | bytes | None):
    handle = await svc.prepare(PrepareParams(spec=spec, task_id="t"))
    data = patch.encode() if isinstance(patch, str) else patch
    return await svc.evaluate(handle, Artifacts(patch=data))


async def test_reference_fix_resolves_on_the_base_commit_and_no_change_does_not(service, repo: HistoryRepo) -> None:
    spec = _spec(repo, base_commit=repo.base)
    assert (await _evaluate(service, spec, repo.fix_patch)).status is TerminalStatus.RESOLVED
    assert (await _evaluate(service, spec, None)).status is TerminalStatus.UNRESOLVED


async def test_without_base_commit_the_head_is_used(service, repo: HistoryRepo) -> None:
    # HEAD already holds the fix (and README.md), so the base's reference patch no longer applies.
    result = await _evaluate(service, _spec(repo), None)
    assert result.status is TerminalStatus.RESOLVED
    assert (await _evaluate(service, _spec(repo), repo.fix_patch)).status is TerminalStatus.INVALID_PATCH


@pytest.fixture
def binary_patch(repo: HistoryRepo, tmp_path: Path) -> bytes:
    """The fix plus a changed and a new binary file, as a diff against the base."""
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "checkout", "-q", repo.fix], check=True)
    (work / "data.bin").write_bytes(b"\x00\x01\x02" * 100)
    (work / "new.bin").write_bytes(bytes(range(256)))
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    argv = ["git", "-C", str(work), "diff", "--cached", "--binary", repo.base]
    return subprocess.run(argv, capture_output=True, check=True).stdout


async def test_a_binary_patch_applies(service, repo: HistoryRepo, binary_patch: bytes) -> None:
    patch = binary_patch
    assert b"GIT binary patch" in patch
    result = await _evaluate(service, _spec(repo, base_commit=repo.base), patch)
    assert result.status is TerminalStatus.RESOLVED


async def test_unknown_base_commit_is_refused_at_prepare(service, repo: HistoryRepo) -> None:
    with pytest.raises(InvalidArgument, match="is not a commit"):
        await service.prepare(PrepareParams(spec=_spec(repo, base_commit="0" * 40), task_id="t"))
    with pytest.raises(InvalidArgument, match="plain ref name"):
        await service.prepare(PrepareParams(spec=_spec(repo, base_commit="HEAD~1"), task_id="t"))
