"""A real SWE-bench-style instance of a small real library (``toml``), and its image, for tests.

The repository is ``toml``'s own source (copied from the installed package) committed into a git repository
with a bug planted at ``base_commit`` (booleans dumped as ``True`` instead of ``true``); the gold ``patch`` is
the one-line fix, the ``test_patch`` adds the test that shows it. The eval script has the official shape
(reset the test files, apply the test patch, run the tests between the output markers, reset again). The image
is the offline Python test image with the repository at ``/testbed``.

``editable=True`` makes the instance as the official images have theirs: the repository carries a ``setup.py``
and the image installs it with ``pip install -e`` into a venv (``/opt/venv``, ``src/`` layout, so the package
is found only through the install's ``.pth``/``.egg-link`` naming ``/testbed/src``; the same markers are copied
into the system Python's site directory, a plain interpreter as a conda environment is), and the eval script
activates the venv and runs its ``python -m pytest`` without putting ``src`` on ``sys.path`` itself.
"""

from __future__ import annotations

import importlib.util
import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

__all__ = ["EDITABLE_IMAGE_TAG", "IMAGE_TAG", "INSTANCE_ID", "build_image", "make_instance"]

INSTANCE_ID = "uiri__toml-1"
IMAGE_TAG = "sweb.eval.x86_64.uiri_1776_toml-1:polar-test"
EDITABLE_IMAGE_TAG = "sweb.eval.x86_64.uiri_1776_toml-1:polar-test-editable"
_SETUP_PY = """from setuptools import setup

setup(name="toml", version="0.10.2", package_dir={"": "src"}, packages=["toml"])
"""
# The editable install's markers are also copied into the system Python's site directory: a plain (not venv)
# interpreter with the install, as a conda environment of the official images is.
_INSTALL = (
    "RUN python3 -m venv --system-site-packages /opt/venv && /opt/venv/bin/pip install -q --no-index "
    "--no-build-isolation --no-use-pep517 -e /testbed && mkdir -p /usr/local/lib/python3.11/dist-packages && "
    "cp /opt/venv/lib/python3.11/site-packages/easy-install.pth /opt/venv/lib/python3.11/site-packages/toml.egg-link "
    "/usr/local/lib/python3.11/dist-packages/\n"
)
_BASIC_TESTS = """import toml


def test_loads_table():
    assert toml.loads("[a]\\nb = 1\\n") == {"a": {"b": 1}}


def test_dumps_int():
    assert toml.dumps({"n": 3}) == "n = 3\\n"
"""
_BOOL_TEST = """import toml


def test_dumps_bool():
    assert toml.dumps({"flag": True}) == "flag = true\\n"
"""
_EVAL = """#!/bin/bash
set -uxo pipefail
{activate}cd /testbed
git checkout {base} -- tests/test_basic.py
git apply -v - <<'EOF_114329324912'
{test_patch}
EOF_114329324912
: '>>>>> Start Test Output'
{run_tests} -p no:cacheprovider -rA tests/test_basic.py tests/test_bool.py
: '>>>>> End Test Output'
git checkout {base} -- tests/test_basic.py
rm -f tests/test_bool.py
"""


def _git(repo: Path, *args: str) -> str:
    argv = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(argv, cwd=repo, check=True, capture_output=True, text=True).stdout


def make_instance(root: Path, python: str = "python3", *, editable: bool = False) -> tuple[Path, dict[str, Any]]:
    """``(repository, record)``: the repository at its base commit and the instance record (swebench 5 schema).

    ``python`` is the interpreter the eval script runs pytest with (the image's ``python3`` by default), with
    ``PYTHONPATH=src``; ``editable`` instead runs the venv's Python of an editable install (module docstring).
    """
    spec = importlib.util.find_spec("toml")
    if spec is None or spec.origin is None:
        raise RuntimeError("the toml package is not installed")
    source = Path(spec.origin).parent
    repo = root / "testbed"
    (repo / "src" / "toml").mkdir(parents=True)
    (repo / "tests").mkdir()
    for file in sorted(source.glob("*.py")):
        (repo / "src" / "toml" / file.name).write_text(file.read_text(encoding="utf-8"), encoding="utf-8")
    encoder = repo / "src" / "toml" / "encoder.py"
    fixed = encoder.read_text(encoding="utf-8")
    if "bool: lambda v: unicode(v).lower()," not in fixed:
        raise RuntimeError("unexpected toml source")
    encoder.write_text(fixed.replace("bool: lambda v: unicode(v).lower(),", "bool: lambda v: unicode(v),"))
    (repo / "tests" / "test_basic.py").write_text(_BASIC_TESTS, encoding="utf-8")
    if editable:
        (repo / "setup.py").write_text(_SETUP_PY, encoding="utf-8")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "toml 0.10.2 (booleans dumped as True)")
    base = _git(repo, "rev-parse", "HEAD").strip()
    encoder.write_text(fixed, encoding="utf-8")
    patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    (repo / "tests" / "test_bool.py").write_text(_BOOL_TEST, encoding="utf-8")
    _git(repo, "add", "-N", "tests/test_bool.py")
    test_patch = _git(repo, "diff")
    _git(repo, "rm", "-q", "--cached", "tests/test_bool.py")
    (repo / "tests" / "test_bool.py").unlink()
    record = {
        "instance_id": INSTANCE_ID,
        "repo": "uiri/toml",
        "base_commit": base,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": "toml.dumps writes booleans as True/False, which is not TOML.",
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
        "version": "0.10",
        "environment_setup_commit": base,
        "FAIL_TO_PASS": '["tests/test_bool.py::test_dumps_bool"]',
        "PASS_TO_PASS": '["tests/test_basic.py::test_loads_table", "tests/test_basic.py::test_dumps_int"]',
        "eval_script": _EVAL.format(
            base=base,
            test_patch=test_patch.rstrip("\n"),
            activate="source /opt/venv/bin/activate\n" if editable else "",
            run_tests="python -m pytest" if editable else f"PYTHONPATH=src {python} -m pytest",
        ),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "image": EDITABLE_IMAGE_TAG if editable else IMAGE_TAG,
    }
    return repo, record


def build_image(client: Any, base_image: str, repo: Path, *, editable: bool = False) -> str:
    """Build :data:`IMAGE_TAG`: ``base_image`` with ``repo`` (its history included) at ``/testbed``; with
    ``editable``, :data:`EDITABLE_IMAGE_TAG`, the repository also installed editable into ``/opt/venv``."""
    tag = EDITABLE_IMAGE_TAG if editable else IMAGE_TAG
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        install = _INSTALL if editable else ""
        dockerfile = f"FROM {base_image}\nCOPY testbed /testbed\n{install}RUN chmod -R a+rX /testbed\n".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(repo, arcname="testbed")
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, network_mode="none")
    return tag
