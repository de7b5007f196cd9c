"""The import contract in pyproject.toml, applied by lint-imports to a small project with the same package names:
it keeps a clean layout and refuses a service importing another service, or polar_core importing a service."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
_LINT = Path(sys.executable).parent / "lint-imports"


def _project(tmp_path: Path, imports: dict[str, str]) -> Path:
    """One empty module per root package, plus ``imports`` (package → the line its module holds)."""
    config = tomllib.loads((_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in config["root_packages"]:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "mod.py").write_text(imports.get(package, "") + "\n")
    lines = ["[importlinter]", "root_packages =", *(f"    {p}" for p in config["root_packages"])]
    for contract in config["contracts"]:
        lines += [
            f"[importlinter:contract:{contract['id']}]",
            f"name = {contract['name']}",
            "type = layers",
            "layers =",
        ]
        lines += [f"    {layer}" for layer in contract["layers"]]
    (tmp_path / ".importlinter").write_text("\n".join(lines) + "\n")
    return tmp_path


def _lint(project: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(project), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(_LINT), "--no-cache"], cwd=project, env=env, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which(str(_LINT)) is None, reason="import-linter is not installed (scripts/setup.sh)")
def test_the_layout_the_contract_allows_passes(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        {
            "polar_run": "import gateway.mod, rollout_server.mod, polar_client.mod",
            "gateway": "import runtimes.mod, polar_checks.mod, polar_core.mod",
            "polar_client": "import polar_checks.mod",
            "polar_checks": "import polar_core.mod",
            "polar_core": "import polar.mod",
        },
    )
    result = _lint(project)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which(str(_LINT)) is None, reason="import-linter is not installed (scripts/setup.sh)")
@pytest.mark.parametrize(
    ("importer", "line", "message"),
    [
        ("rollout_server", "import gateway.mod", "rollout_server is not allowed to import gateway"),
        ("polar_client", "import reconstructor.mod", "polar_client is not allowed to import reconstructor"),
        ("polar_core", "import model_proxy.mod", "polar_core is not allowed to import model_proxy"),
        ("polar_checks", "import polar_client.mod", "polar_checks is not allowed to import polar_client"),
    ],
)
def test_a_cross_layer_import_breaks_the_contract(tmp_path: Path, importer: str, line: str, message: str) -> None:
    result = _lint(_project(tmp_path, {importer: line}))
    assert result.returncode != 0
    assert message in result.stdout
