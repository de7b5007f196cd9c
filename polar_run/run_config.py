"""Turning a task file plus command-line overrides into what the embedded stack runs (``polar run``/``generate``).

Pure functions over parsed YAML: no servers, no ports, so they are unit-tested directly. They read only files,
and, for a docker task, try the local Docker engine's Unix socket (:func:`check_docker_engine`).

What is resolved here:

* paths in the task (``evaluator.repo``, ``evaluator.test_patch``, ``metadata.repo``, ``backend.script``) are
  made absolute relative to the task file, because the services do not know where it was;
* ``--harness`` replaces the harness (its options are dropped when the name changes); a harness name is read
  with ``_`` as ``-`` (``claude_code`` is ``claude-code``: registered names are spelled with hyphens, see
  :func:`harness_name`); a task without a harness gets :data:`DEFAULT_HARNESS`; with the in-process
  backend pi's calls are capped at :data:`IN_PROCESS_MAX_TOKENS` unless the task or ``--max-tokens`` sets it;
* ``--backend`` replaces the task's backend table (``--backend-option`` adds options); the backend itself is
  configured on the embedded proxy, and the task keeps only its name and ``model_name``;
* a local runtime may read the installed harness CLIs (``read_only_paths``);
* what the run needs must be installed, else it is refused with one line naming the command that installs it:
  the harness's program (:func:`harness_program`, asked of the adapter, so every registered harness is covered)
  and, for a docker task, a Docker engine.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import yaml

from polar_checks.harnesses import HARNESS_OPTIONS
from polar_client.formats import select_mapping
from polar_client.taskfile import task_from_mapping
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_core.task_paths import absolute_path, resolve_task_paths

if TYPE_CHECKING:
    from gateway.harnesses import HarnessLaunch

__all__ = [
    "DEFAULT_BACKEND",
    "DEFAULT_HARNESS",
    "DEFAULT_MODEL",
    "IN_PROCESS_MAX_TOKENS",
    "OWN_PROGRAM_HARNESS",
    "PreparedTask",
    "RunOverrides",
    "check_docker_engine",
    "check_harness_launch",
    "find_harness_root",
    "harness_install_command",
    "harness_name",
    "harness_overrides",
    "harness_program",
    "load_task_mapping",
    "parse_backend_options",
    "prepare_task",
    "task_images",
]

DEFAULT_MODEL = "smollm2"
DEFAULT_BACKEND = "transformers"
# pi: the smallest system prompt of the real CLIs (~1,600 SmolLM2 tokens with its 4 tools); Qwen Code
# (~18,000) and Claude Code do not fit SmolLM2's 8,192-token context at all.
DEFAULT_HARNESS = "pi"
# With the in-process model (SmolLM2-135M samples ~10 tokens/s on 2 CPU cores, one call at a time) pi's calls
# are capped unless the task or --max-tokens says otherwise: uncapped, pi asks for 16,384 tokens and a rambling
# answer runs until the agent's timeout. pi's context window stays at its default (128k): with SmolLM2's real
# 8k, pi would compact (summarise the conversation, an extra call) after every turn.
IN_PROCESS_MAX_TOKENS = 128
# The harness whose program the task brings itself (``argv``); every other registered harness runs a program that
# ``scripts/setup_harnesses.sh NAME`` installs under ``.harnesses``, and :func:`harness_program` finds which.
OWN_PROGRAM_HARNESS = "command"
_MODEL_NAME = "policy"


@dataclasses.dataclass(frozen=True, slots=True)
class RunOverrides:
    """Command-line choices that override the task file (``None``: keep the task's).

    Attributes:
        samples: ``num_samples``.
        harness: Harness name.
        backend: Backend name; replaces the task's backend table.
        backend_options: Options added to the backend (after ``backend``'s replacement, if any).
        timeout_s: ``timeout_seconds`` (the agent's budget).
        max_tokens: Output limit per model call, given to harnesses that take one (pi's ``max_tokens``).
        harness_root: The directory holding ``node_modules/.bin`` with the installed CLIs.
        context_length: The policy's context in tokens, prompt plus output (``--context-length``; the in-process
            ``tiny`` and ``smollm2`` models included).
        task_roots: Directories (``--task-root``) the tasks' repository and test-patch paths may lie under,
            besides the task file's (``polar run``) or the dataset's and task files' (``polar generate``).
        build_missing_images: Build a Harbor task's Dockerfile when its named ``docker_image`` is not on the
            Docker host (``--build-missing-images``; ``None``: the client setting, default off).
    """

    samples: int | None = None
    harness: str | None = None
    backend: str | None = None
    backend_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    timeout_s: float | None = None
    max_tokens: int | None = None
    harness_root: Path | None = None
    context_length: int | None = None
    task_roots: tuple[Path, ...] = ()
    build_missing_images: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedTask:
    """A task ready to submit, and how the embedded proxy must be configured for it.

    Attributes:
        task: The task mapping to submit (``polar_client.task_from_mapping`` reads it).
        task_dir: The directory of the task file.
        backend: Backend name for the proxy.
        backend_options: Backend options for the proxy (paths resolved).
        model_name: The model name harnesses ask for.
        harness: The harness name.
        harness_bin_dir: Where the harness CLI lives, for the gateway's ``PATH`` (None: not a CLI harness).
        backend_named: Whether the task, ``--backend`` or ``--backend-option`` chose the backend or its options;
            otherwise ``backend`` is :data:`DEFAULT_BACKEND` and ``polar run`` may serve a faster CPU path.
    """

    task: dict[str, Any]
    task_dir: Path
    backend: str
    backend_options: dict[str, Any]
    model_name: str
    harness: str
    harness_bin_dir: Path | None
    backend_named: bool = False

    @property
    def task_id(self) -> str:
        """The task's id."""
        return str(self.task.get("task_id") or "")


def task_images(task: Mapping[str, Any]) -> tuple[str, ...]:
    """The container images a task file names: the image a Harbor task's build made, or ``runtime.image``.

    ``polar run`` and ``polar generate`` run the user's own files on the user's machine, so their embedded stack
    allows exactly these images (a fleet's operator lists its own ``allowed_images``).
    """
    from polar_client.formats.harbor import built_image

    runtime = task.get("runtime")
    named = runtime.get("image") if isinstance(runtime, Mapping) else None
    return tuple(dict.fromkeys(i for i in (built_image(task), named) if isinstance(i, str) and i))


def load_task_mapping(path: Path, **format_opts: Any) -> dict[str, Any]:
    """Read a task file as a mapping (a Harbor task directory or its ``task.toml``: built and converted).

    ``format_opts`` go to the foreign format's reader (:mod:`polar_client.formats`), e.g. ``build_missing_images``.

    Raises:
        InvalidArgument: The file cannot be read or is not a YAML mapping.
    """
    foreign = select_mapping(path, **format_opts)  # SWE-bench records, ... (``FILE#TASK_ID`` picks one of many)
    if foreign is not None:
        return foreign
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidArgument(f"cannot read task file {path}: {exc}") from None
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"{path}: a task file must be a mapping")
    return dict(data)


def parse_backend_options(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` strings; values are YAML scalars (``4`` is an int, ``true`` a bool).

    Raises:
        InvalidArgument: An item without ``=``.
    """
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"--backend-option wants KEY=VALUE, not {item!r}")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        options[key.strip()] = value
    return options


def find_harness_root(candidates: Sequence[Path]) -> Path | None:
    """Return the first ``.harnesses`` directory among ``candidates`` that holds an installed harness.

    That is ``node_modules/.bin`` (the npm CLIs) or ``py`` (the Python agents' environments): either may be
    installed without the other (``scripts/setup_harnesses.sh NAME``).
    """
    for candidate in candidates:
        if (candidate / "node_modules" / ".bin").is_dir() or (candidate / "py").is_dir():
            return candidate.resolve()
    return None


def harness_install_command(name: str) -> str:
    """The command that installs harness ``name`` into the checkout's ``.harnesses``."""
    return f"bash scripts/setup_harnesses.sh {name}"


def harness_program(name: str, options: Mapping[str, Any], root: Path) -> Path | None:
    """The file harness ``name`` starts when it runs from the installation at ``root`` (a ``.harnesses``).

    Derived from the adapter itself (its dry-run launch with ``root/node_modules/.bin`` as the CLIs' directory),
    so every harness in the registry is covered and none can be forgotten: a bare program name is an npm CLI in
    ``node_modules/.bin``; an absolute path under ``root`` is a Python agent's interpreter (``py/<name>``).

    Returns:
        The path to check, or ``None`` when the task brings the program itself (the ``command`` harness, or an
        option such as ``venv`` pointing outside ``root``).

    Raises:
        InvalidArgument: Unknown harness, or options the adapter rejects.
    """
    if name == OWN_PROGRAM_HARNESS:
        return None
    bin_dir = root / "node_modules" / ".bin"
    program = _launch(name, options, "", PurePosixPath(bin_dir)).argv[0]
    if "/" not in program:
        return bin_dir / program
    path = Path(program)
    return path if path.is_relative_to(root) else None


def _section(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"task field {key!r} must be a mapping")
    return dict(value)


def _harness(data: dict[str, Any], overrides: RunOverrides, backend: str) -> tuple[str, dict[str, Any]]:
    table = _section(data, "harness")
    name = str(table.pop("name", "") or "")
    name = harness_name(name)
    wanted = overrides.harness and harness_name(overrides.harness)
    if wanted and wanted != name:
        name, table = wanted, {}
    if not name:
        name = DEFAULT_HARNESS
    options = dict(table)
    if name == "pi":
        if overrides.max_tokens is not None:
            options["max_tokens"] = overrides.max_tokens
        elif backend == DEFAULT_BACKEND:
            options.setdefault("max_tokens", IN_PROCESS_MAX_TOKENS)
    return name, options


def harness_name(name: str) -> str:
    """A harness name as ``polar run`` reads it: ``_`` as ``-`` unless the name is registered as given.

    Registered names are spelled with hyphens (``polar_checks.harnesses.HARNESS_OPTIONS``); ``polar run``
    accepts the underscore spelling users type (``claude_code``, promised in ``docs/run.md``) by this one rule
    instead of an alias table, so a new harness needs no entry here. The rollout server takes names as
    registered only.
    """
    return name if name in HARNESS_OPTIONS else name.replace("_", "-")


def harness_overrides(data: dict[str, Any], overrides: RunOverrides, backend: str) -> tuple[str, dict[str, Any]]:
    """The task's harness name and options after ``--harness`` and ``--max-tokens`` (pi's calls capped at
    :data:`IN_PROCESS_MAX_TOKENS` when ``backend`` is the in-process one and nothing else says)."""
    return _harness(data, overrides, backend)


def _launch(name: str, options: Mapping[str, Any], instruction: str, bin_dir: PurePosixPath | None) -> HarnessLaunch:
    """The adapter's dry-run launch (pure: it starts nothing)."""
    from gateway.harnesses import HarnessContext, ProxyEndpoints, get_adapter

    root = PurePosixPath("/polar-check")
    url = "http://127.0.0.1:1"
    context = HarnessContext(
        home=root / "home",
        workspace=root / "workspace",
        tmp=root / "tmp",
        instruction=instruction,
        endpoints=ProxyEndpoints(
            token="check", anthropic_base_url=url, openai_base_url=url + "/v1", google_base_url=url
        ),
        model=_MODEL_NAME,
        options=dict(options),
        bin_dir=bin_dir,
    )
    try:
        return get_adapter(name).prepare(context)
    except (TypeError, ValueError, AttributeError) as exc:
        raise InvalidArgument(f"invalid options for harness {name!r}: {exc}") from None


def check_harness_launch(name: str, options: Mapping[str, Any], instruction: str) -> None:
    """Dry-run the harness adapter (pure: it starts nothing) so a bad name or option fails before the stack starts.

    Raises:
        InvalidArgument: Unknown harness, or options the adapter rejects.
    """
    _launch(name, options, instruction, None)


def _installed_harness(name: str, options: Mapping[str, Any], root: Path | None) -> Path | None:
    """The harness installation ``name`` runs from (``None``: the task brings its program).

    Raises:
        FailedPrecondition: The harness's program is not installed; the one-line message names the command that
            installs it.
    """
    program = harness_program(name, options, root or Path(".harnesses"))
    if program is None:
        return None
    if root is None or not program.exists():
        raise FailedPrecondition(
            f"the {name} harness is not installed (no {program}); install it with "
            f"`{harness_install_command(name)}` (every harness: `bash scripts/setup.sh --all`; or --harness-dir "
            "DIR), or choose `--harness command` with a command of your own",
            details={"harness": name, "reason": "harness_not_installed"},
        )
    return root


def check_docker_engine() -> None:
    """Raise unless the local Docker engine the docker runtime uses (the SDK's defaults: ``$DOCKER_HOST``, else
    ``/var/run/docker.sock``) accepts a connection; without one every session would fail at INIT and be retried.

    Only a Unix socket is checked (by connecting to it: the SDK leaks the socket of a failed connection); a remote
    engine (``tcp://``, ``ssh://``) is left to the runtime, which reports its own errors.

    Raises:
        FailedPrecondition: Nothing listens on the socket; the one-line message names the command that installs
            an engine.
    """
    import socket

    from docker.utils import kwargs_from_env

    base_url = str(kwargs_from_env().get("base_url") or "unix:///var/run/docker.sock")
    scheme, _, path = base_url.partition("://")
    if scheme not in ("unix", "http+unix"):
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        try:
            sock.connect(path)
        except OSError as exc:
            raise FailedPrecondition(
                f"the task runs in a docker runtime, and no Docker engine listens on {path} ({exc.strerror or exc}); "
                "install one with `bash scripts/setup.sh --all` (docker.io, as root) and start `dockerd`, or set "
                "DOCKER_HOST",
                details={"reason": "docker_not_available"},
            ) from None


def _backend(data: dict[str, Any], overrides: RunOverrides, task_dir: Path) -> tuple[str, dict[str, Any], str, bool]:
    table = _section(data, "backend")
    name = str(table.pop("name", "") or "")
    for key in ("script",):
        if key in table:
            table[key] = absolute_path(table[key], task_dir, must_exist=True)
    if isinstance(table.get("sessions"), Mapping):
        table["sessions"] = {k: absolute_path(v, task_dir, must_exist=True) for k, v in table["sessions"].items()}
    if overrides.backend and overrides.backend != name:
        name, table = overrides.backend, {}
    cli_options = dict(overrides.backend_options)
    if isinstance(cli_options.get("script"), str):
        cli_options["script"] = absolute_path(cli_options["script"], Path.cwd(), must_exist=True)
    table.update(cli_options)
    model_name = str(table.pop("model_name", "") or _MODEL_NAME)
    return name or DEFAULT_BACKEND, table, model_name, bool(name or table)


def prepare_task(
    path: Path, overrides: RunOverrides | None = None, *, data: Mapping[str, Any] | None = None
) -> PreparedTask:
    """Read the task file at ``path`` (or use ``data``, parsed from it) and apply ``overrides``.

    Raises:
        InvalidArgument: A malformed task or override.
        FailedPrecondition: The harness is a real CLI that is not installed.
    """
    overrides = overrides or RunOverrides()
    if path.is_dir():  # a Harbor task directory: its paths resolve from the directory itself
        path = path / "task.toml"
    task_dir = path.parent.resolve()
    opts = {"build_missing_images": overrides.build_missing_images}
    task = copy.deepcopy(dict(data)) if data is not None else load_task_mapping(path, **opts)
    if not task.get("task_id"):
        task["task_id"] = path.parent.name if path.name in ("task.yaml", "task.yml") else path.stem
    if not task.get("instruction"):
        raise InvalidArgument(f"{path}: the task has no instruction")
    if overrides.samples is not None:
        if overrides.samples < 1:
            raise InvalidArgument("--samples must be at least 1")
        task["num_samples"] = overrides.samples
    if overrides.timeout_s is not None:
        task["timeout_seconds"] = overrides.timeout_s

    for key in ("evaluator", "metadata"):
        _section(task, key)  # a mapping or absent, else a clear error
    task = resolve_task_paths(task, task_dir)

    backend, backend_options, model_name, backend_named = _backend(task, overrides, task_dir)
    harness, harness_options = _harness(task, overrides, backend)
    task["harness"] = {"name": harness, **harness_options}
    check_harness_launch(harness, harness_options, str(task["instruction"]))
    # The proxy is configured with the backend; the gateway reads only ``model_name`` (the name harnesses ask for).
    task["backend"] = {"name": backend, "model_name": model_name}

    bin_dir: Path | None = None
    runtime = _section(task, "runtime")
    root = _installed_harness(harness, harness_options, overrides.harness_root)
    if root is not None:
        bin_dir = root / "node_modules" / ".bin"
        if str(runtime.get("kind", "local")) == "local":
            paths = [str(p) for p in runtime.get("read_only_paths", [])]
            if str(root) not in paths:
                runtime["read_only_paths"] = [*paths, str(root)]
    if str(runtime.get("kind", "local")) == "docker":
        check_docker_engine()
    if runtime:
        task["runtime"] = runtime
    task_from_mapping(task)  # every field checked (max_policy_lag, stale_policy, ...) before anything starts
    return PreparedTask(
        task=task,
        task_dir=task_dir,
        backend=backend,
        backend_options=backend_options,
        model_name=model_name,
        harness=harness,
        harness_bin_dir=bin_dir,
        backend_named=backend_named,
    )
