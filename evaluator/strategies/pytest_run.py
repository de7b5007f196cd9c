"""The trusted pytest invocation of the ``swe`` strategy: which configuration, which plugins, which environment.

A patch must not decide how its own tests run. By the time the tests run, every pytest configuration file
and ``conftest.py`` has been put back to the base tree's content (``patching.DEFAULT_PROTECTED``); on top of
that the evaluator names the configuration itself rather than letting pytest discover one:

* **Configuration**: the file pytest 9 would pick in the (restored) repository — for each test file, from
  its directory up to the repository root, ``pytest.toml``, ``.pytest.toml``, ``pytest.ini``,
  ``.pytest.ini``, ``pyproject.toml`` with a ``[tool.pytest]``/``[tool.pytest.ini_options]`` table,
  ``tox.ini`` with ``[pytest]``, ``setup.cfg`` with ``[tool:pytest]`` (first hit wins; a ``pyproject.toml``
  without a pytest table is the fallback, as in pytest) — passed as ``-c <file>``. The file stays where it is,
  since pytest resolves relative paths in it (``pythonpath``, ...) against its directory. Nothing above the
  repository is ever used: without a configuration in the repository, an empty one the evaluator writes
  outside it is passed, with ``--confcutdir <repo>``. ``--rootdir <repo>`` always.
* **Plugins**: at Prepare, before any patch exists, the ``pytest11`` entry points installed in the runtime
  are listed; the tests run with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` and exactly those, as ``-p <name>``.
  An entry point a patch adds (a ``*.dist-info``/``*.egg-info`` in a repository on ``sys.path``) is not
  loaded; the metadata directories are protected files too. When the listing fails (an old image),
  autoloading stays on and the log says so.
* **Environment**: ``PYTEST_ADDOPTS`` and ``PYTEST_PLUGINS`` are emptied, bytecode writing and the user
  site are off.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath

from evaluator.strategies.base import EvalContext

__all__ = [
    "CONFIG_NAMES",
    "TrustedPytest",
    "choose_config",
    "config_candidates",
    "list_pytest_plugins",
    "pytest_env",
    "trusted_pytest",
]

# pytest 9's discovery order within one directory (``_pytest.config.findpaths.CONFIG_LOADERS_BY_NAME``).
CONFIG_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
# These are the configuration whenever they exist; the others only with a pytest section.
_ALWAYS = frozenset({"pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini"})
_INI_SECTION = {
    "tox.ini": re.compile(r"^\s*\[pytest\]\s*$", re.M),
    "setup.cfg": re.compile(r"^\s*\[tool:pytest\]\s*$", re.M),
}

# Run in the runtime at Prepare (base tree only): the names of the pytest11 entry points it has installed.
_LIST_PLUGINS = """\
import json
names = set()
try:
    from importlib.metadata import distributions
    for dist in distributions():
        for ep in dist.entry_points:
            if ep.group == "pytest11":
                names.add(ep.name)
except ImportError:
    import pkg_resources
    names = {ep.name for ep in pkg_resources.iter_entry_points("pytest11")}
print(json.dumps(sorted(names)))
"""

_FILES_THAT_EXIST = 'for f do [ -f "$f" ] && [ ! -L "$f" ] && printf "%s\\0" "$f"; done; true'


def config_candidates(test_files: Iterable[str]) -> list[str]:
    """Every path, relative to the repository, that could hold the configuration, in pytest's order."""
    out: list[str] = []
    for rel in test_files:
        parent = PurePosixPath(rel).parent
        for base in (parent, *parent.parents):
            for name in CONFIG_NAMES:
                path = str(base / name) if str(base) != "." else name
                if path not in out:
                    out.append(path)
    return out


def _holds_pytest_config(name: str, text: str) -> bool:
    if name in _ALWAYS:
        return True
    if name == "pyproject.toml":
        try:
            tool = tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError:
            return True  # pytest fails on it and says why in the log: better than silently skipping it
        return isinstance(tool, dict) and "pytest" in tool
    return bool(_INI_SECTION[name].search(text))


def choose_config(test_files: Sequence[str], contents: Mapping[str, str]) -> str | None:
    """The configuration file pytest would use, relative to the repository; ``None`` when there is none.

    Args:
        test_files: The test files pytest is given, in command-line order.
        contents: The text of each candidate file that exists (regular files only).
    """
    fallback: str | None = None
    for rel in test_files:
        parent = PurePosixPath(rel).parent
        for base in (parent, *parent.parents):
            for name in CONFIG_NAMES:
                path = str(base / name) if str(base) != "." else name
                if path not in contents:
                    continue
                if name == "pyproject.toml" and fallback is None:
                    fallback = path
                if _holds_pytest_config(name, contents[path]):
                    return path
    return fallback


async def list_pytest_plugins(ctx: EvalContext) -> list[str] | None:
    """The ``pytest11`` entry point names installed in the runtime; ``None`` when they cannot be listed."""
    runtime = ctx.need_runtime()
    argv = [ctx.python, "-c", _LIST_PLUGINS]
    result = await ctx.run(argv, cwd=runtime.root / "eval", env=pytest_env(), timeout=120.0)
    if result.exit_code != 0:
        ctx.log.write("cannot list pytest plugins: plugin autoloading stays on", result.stderr[-1000:])
        return None
    try:
        names = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        ctx.log.write("cannot list pytest plugins: plugin autoloading stays on", result.stdout[-1000:])
        return None
    ctx.log.write("pytest plugins installed in the runtime", " ".join(names) or "(none)")
    return names


def pytest_env(*, autoload: bool = True) -> dict[str, str]:
    """The environment every test run gets: no options or plugins from the environment."""
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTEST_ADDOPTS": "", "PYTEST_PLUGINS": ""}
    if not autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


class TrustedPytest:
    """One evaluation's trusted pytest arguments.

    Attributes:
        args: ``-c``, ``--rootdir`` (and ``--confcutdir``), ``-p no:cacheprovider`` and the ``-p`` plugins.
        env: The environment of the test run.
        junit: Where the JUnit report goes: a fresh directory outside the repository, named at random.
        config: The configuration file passed with ``-c``.
    """

    def __init__(self, args: list[str], env: dict[str, str], junit: PurePosixPath, config: PurePosixPath) -> None:
        self.args = args
        self.env = env
        self.junit = junit
        self.config = config

    def shell(self) -> str:
        """``args`` quoted for a shell command line."""
        return " ".join(shlex.quote(a) for a in self.args)


async def trusted_pytest(ctx: EvalContext, test_files: Sequence[str], plugins: list[str] | None) -> TrustedPytest:
    """Pick the configuration in the restored repository and make a fresh report directory."""
    runtime = ctx.need_runtime()
    repo = ctx.repo_dir
    if repo is None:
        raise RuntimeError("trusted_pytest before the repository was prepared")
    report_dir = runtime.root / "eval" / f"report-{secrets.token_hex(12)}"
    # mkdir without -p: the directory must not exist yet, so nothing in it was written before this run.
    await ctx.run(["mkdir", "-m", "700", str(report_dir)], check=True)
    candidates = config_candidates(test_files)
    found = await ctx.run(["sh", "-c", _FILES_THAT_EXIST, "sh", *candidates], cwd=repo, check=True)
    contents: dict[str, str] = {}
    for rel in (p for p in found.stdout.split("\0") if p):
        name = PurePosixPath(rel).name
        if name in _ALWAYS:
            contents[rel] = ""
        else:
            contents[rel] = (await ctx.run(["cat", "--", rel], cwd=repo, check=True)).stdout
    chosen = choose_config(test_files, contents)
    args: list[str]
    if chosen is not None:
        config = repo / chosen
        args = ["-c", str(config), "--rootdir", str(repo)]
    else:
        config = report_dir / "pytest.ini"
        await runtime.upload(b"[pytest]\n", config)
        args = ["-c", str(config), "--rootdir", str(repo), "--confcutdir", str(repo)]
    args += ["-p", "no:cacheprovider"]
    for name in plugins or ():
        args += ["-p", name]
    env = pytest_env(autoload=plugins is None)
    ctx.log.write(
        "trusted pytest invocation",
        f"config: {config}{'' if chosen else ' (evaluator-written, empty)'}\n"
        f"plugins: {'autoload (could not be listed)' if plugins is None else ' '.join(plugins) or '(none)'}\n"
        f"report: {report_dir / 'junit.xml'}",
    )
    return TrustedPytest(args, env, report_dir / "junit.xml", config)
