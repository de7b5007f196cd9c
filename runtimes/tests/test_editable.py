"""Which directories an image's editable installs put on ``sys.path`` (parsing only; the image test is
``integration_tests/test_swebench_eval.py::test_in_the_instance_image[editable-install]``)."""

from __future__ import annotations

import sys
from pathlib import PurePosixPath

from runtimes.editable import _in_copy, editable_roots, pth_line, scan_argv

SITE = "/opt/miniconda3/envs/testbed/lib/python3.9/site-packages"


def test_pth_and_egg_link_lines_name_directories() -> None:
    scan = "\n".join(
        [
            f"{SITE}/easy-install.pth:/testbed/src",
            f"{SITE}/toml.egg-link:/testbed/src",  # the same directory again: kept once
            f"{SITE}/django.egg-link:/testbed/",
            f"{SITE}/__editable__.sympy-1.12.pth:/testbed",
        ]
    )
    assert editable_roots(scan, "/testbed") == ["/testbed/src", "/testbed"]


def test_finder_modules_and_import_lines_name_packages_whose_parent_goes_on_the_path() -> None:
    finder = f"{SITE}/__editable___astropy_5_3_finder.py"
    scan = "\n".join(
        [
            f"{finder}:MAPPING: dict[str, str] = {{'astropy': '/testbed/astropy', 'shim': '/testbed/lib/shim.py'}}",
            f"{finder}:NAMESPACES: dict[str, list[str]] = {{'ns': ['/testbed/src/ns']}}",
            f"{SITE}/hook.pth:import sys; sys.path.insert(0, '/testbed/vendor')",
        ]
    )
    assert editable_roots(scan, "/testbed") == ["/testbed", "/testbed/lib", "/testbed/src", "/testbed/vendor"]


def test_paths_elsewhere_relative_lines_and_lookalike_prefixes_are_ignored() -> None:
    scan = "\n".join(
        [
            f"{SITE}/toml.egg-link:../",
            f"{SITE}/other.pth:/testbed2/src",
            f"{SITE}/other.pth:/opt/testbed",
            f"{SITE}/distutils-precedence.pth:import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = True",
            "no separator at all",
        ]
    )
    assert editable_roots(scan, "/testbed") == []
    assert editable_roots(f"{SITE}/x.pth:/testbed/src", "/testbed/") == ["/testbed/src"]


def test_mapped_into_the_copy() -> None:
    copy = PurePosixPath("/polar/s-1/workspace")
    assert _in_copy("/testbed", "/testbed", copy) == "/polar/s-1/workspace"
    assert _in_copy("/testbed/src", "/testbed/", copy) == "/polar/s-1/workspace/src"


def test_the_scan_prunes_the_session_directory() -> None:
    argv = scan_argv("/testbed", PurePosixPath("/polar/s-1"))
    assert argv[:2] == ["sh", "-c"]
    assert argv[-2:] == ["/testbed", "/polar/s-1"]
    assert '-path "$2" \\) -prune' in argv[2]


def _read_pth(line: str, path: list[str], times: int = 1) -> list[str]:
    """``sys.path`` after site.py executed ``line`` ``times`` times with ``sys.path`` at ``path`` (then restored)."""
    saved = sys.path[:]
    try:
        sys.path[:] = path
        for _ in range(times):
            exec(line, {})
        return sys.path[:]
    finally:
        sys.path[:] = saved


def test_the_pth_line_puts_the_copy_before_the_first_site_directory() -> None:
    line = pth_line(["/polar/s/workspace/src", "/polar/s/workspace"])
    assert line.startswith("import sys; ")  # site.py executes a .pth line only when it starts with "import"
    assert "\n" not in line
    # A venv with system site packages: its own site directory (and the image's editable /testbed) came first.
    venv = ["", "/usr/lib/python3.11", "/opt/venv/lib/python3.11/site-packages", "/testbed/src"]
    assert _read_pth(line, venv) == ["", "/usr/lib/python3.11", "/polar/s/workspace/src", "/polar/s/workspace",
                                     "/opt/venv/lib/python3.11/site-packages", "/testbed/src"]  # fmt: skip
    # The system Python or a conda environment reads the user site first (site.py has appended the user site
    # directory itself when it reads the .pth): before it, and so before the environment's site directory that
    # follows; read twice, nothing is doubled.
    user = "/polar/s/home/.local/lib/python3.9/site-packages"
    early = ["", "/opt/conda/envs/testbed/lib/python3.9", user]
    assert _read_pth(line, early, times=2)[2:] == ["/polar/s/workspace/src", "/polar/s/workspace", user]
