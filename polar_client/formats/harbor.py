"""Harbor / Terminal-Bench task directories as Polar tasks.

A Harbor task is a directory (read with the ``harbor`` package's own ``TaskPaths`` and ``TaskConfig``)::

    task.toml          # [metadata], [verifier] timeout_sec/env, [agent] timeout_sec, [environment] ...
    instruction.md     # the prompt
    environment/       # Docker build context: Dockerfile (or task.toml's environment.docker_image)
    tests/test.sh      # the verifier: writes /logs/verifier/reward.txt (a number) or reward.json
    solution/solve.sh  # optional, Harbor's oracle; never shown to the agent

:func:`task_mappings` turns one (or a directory of them) into the task-file mapping the rest of Polar reads. The
environment image is built here, before the task is submitted, on the Docker daemon the runtimes use
(``docker_host``, else ``DOCKER_HOST``; :func:`runtimes.image_build.build_environment`: offline, once per content
hash). The mapping names that image as the runtime (``kind: docker``), the copy of the image's ``WORKDIR`` as the
workspace's base (``metadata.repo``), and the ``harbor`` evaluator with the task's trusted ``tests/``
(``evaluator.tests_dir``) and verifier timeout. The operator's ``allowed_images`` still decides whether a
gateway or evaluator runs the built image (``polar-harbor/<name>:<hash>``).

A task naming a prebuilt ``environment.docker_image`` that is not on that daemon (Terminal-Bench 2.0 tasks name
registry images) is refused, as nothing is pulled, unless the operator allows building its ``environment/Dockerfile``
instead: ``build_missing_images=True`` (``polar run``/``polar submit --build-missing-images``), or the client
setting ``POLAR_BUILD_MISSING_IMAGES=1`` (:class:`polar_client.settings.ClientSettings`) when not given.

Polar additions, all optional, in task.toml's free-form ``[metadata.polar]`` table: ``harness`` (a table with
``name`` and its options), ``num_samples`` (default 1).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar_core.errors import InvalidArgument

__all__ = ["BUILD_DIR", "built_image", "detect", "is_dataset", "task_mapping", "task_mappings"]

BUILD_DIR = ".polar-harbor"
"""Created in each task directory: the host copies of the images' ``WORKDIR`` (under the task roots with it)."""
_VERIFIER_GRACE_S = 120.0
_POLAR_KEYS = ("harness", "num_samples")


def detect(path: Path) -> bool:
    """Whether ``path`` is a Harbor task directory (or its ``task.toml``)."""
    if path.name == "task.toml" and path.is_file():
        return True
    return path.is_dir() and (path / "task.toml").is_file()


def is_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory of Harbor task directories."""
    return path.is_dir() and not detect(path) and any(p.is_file() for p in path.glob("*/task.toml"))


def _refuse(task_dir: Path, field: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"Harbor task {task_dir}: {field}: {why}", details={"field": field})


def _config(task_dir: Path) -> Any:
    """The task's ``harbor.models.task.config.TaskConfig``."""
    from harbor.models.task.config import TaskConfig
    from pydantic import ValidationError

    try:
        text = (task_dir / "task.toml").read_text(encoding="utf-8")
        tomllib.loads(text)  # a syntax error is reported by line, before pydantic sees the file
        return TaskConfig.model_validate_toml(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _refuse(task_dir, "task.toml", f"cannot be read: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "task.toml"
        raise _refuse(task_dir, f"task.toml {where}", str(first.get("msg"))) from None
    except ValueError as exc:
        raise _refuse(task_dir, "task.toml", str(exc)) from None


def _task_id(task_dir: Path, config: Any) -> str:
    name = str(getattr(getattr(config, "task", None), "name", "") or task_dir.name)
    return re.sub(r"[^A-Za-z0-9._-]+", "__", name).strip("_") or task_dir.name


def _checked_files(task_dir: Path, config: Any) -> tuple[str, Path]:
    """The instruction and the test script, or a refusal naming what is missing."""
    from harbor.models.task.paths import TaskPaths

    paths = TaskPaths(task_dir)
    # Harbor's own input check: no file the task reads (its prompt, build context, tests) may resolve outside the
    # task directory, or a task could send a host file to the model, into an image or into the tests.
    for field, path in (("instruction.md", paths.instruction_path), ("environment/", paths.environment_dir),
                        ("tests/", paths.tests_dir)):  # fmt: skip
        if path.exists() or path.is_symlink():
            try:
                paths.validate_input_tree(path)
            except (ValueError, OSError) as exc:
                raise _refuse(task_dir, field, str(exc)) from None
    if config.steps:
        raise _refuse(task_dir, "task.toml steps", "multi-step Harbor tasks are not supported")
    if str(getattr(config.environment.os, "value", config.environment.os)) not in ("linux", "None"):
        raise _refuse(task_dir, "task.toml environment.os", "only linux tasks are supported")
    try:
        instruction = paths.instruction_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _refuse(task_dir, "instruction.md", f"missing or unreadable ({exc.__class__.__name__})") from None
    if not instruction.strip():
        raise _refuse(task_dir, "instruction.md", "is empty")
    test_sh = paths.tests_dir / "test.sh"
    if not paths.tests_dir.is_dir() or not test_sh.is_file() or test_sh.is_symlink():
        raise _refuse(task_dir, "tests/test.sh", "the task has no tests (tests/test.sh, a regular file)")
    if not config.environment.docker_image and not (paths.environment_dir / "Dockerfile").is_file():
        raise _refuse(task_dir, "environment/Dockerfile", "missing (and task.toml names no environment.docker_image)")
    return instruction, paths.tests_dir


def _polar_fields(task_dir: Path, config: Any) -> dict[str, Any]:
    table = config.metadata.get("polar") or {}
    if not isinstance(table, Mapping):
        raise _refuse(task_dir, "task.toml metadata.polar", "must be a table")
    unknown = sorted(set(table) - set(_POLAR_KEYS))
    if unknown:
        raise _refuse(task_dir, "task.toml metadata.polar", f"unknown key(s) {', '.join(unknown)}")
    out: dict[str, Any] = {}
    if "harness" in table:
        if not isinstance(table["harness"], Mapping) or not table["harness"].get("name"):
            raise _refuse(task_dir, "task.toml metadata.polar.harness", "must be a table with a name")
        out["harness"] = dict(table["harness"])
    if "num_samples" in table:
        out["num_samples"] = table["num_samples"]
    return out


def task_mapping(
    task_dir: Path,
    *,
    build: bool = True,
    docker_host: str = "",
    docker_client: Any | None = None,
    build_missing_images: bool | None = None,
) -> dict[str, Any]:
    """One Harbor task directory as a task mapping (see the module docstring).

    Args:
        task_dir: The task directory.
        build: Build the environment image (else the mapping names the tag and base a build would make).
        docker_host: The Docker daemon to build on (empty: the SDK's environment defaults).
        docker_client: A ``docker.DockerClient`` to use instead.
        build_missing_images: Build the Dockerfile when the named ``environment.docker_image`` is not on the
            daemon (``None``: the client setting ``POLAR_BUILD_MISSING_IMAGES``, default off).

    Raises:
        InvalidArgument: A malformed ``task.toml``, no ``instruction.md``, no ``tests/test.sh``, no Dockerfile,
            or an environment that cannot be built offline (the message and ``details["field"]`` name it).
        FailedPrecondition: No Docker daemon.
    """
    from runtimes.image_build import build_environment, context_hash, image_tags

    task_dir = (task_dir.parent if task_dir.name == "task.toml" else task_dir).resolve()
    config = _config(task_dir)
    instruction, tests_dir = _checked_files(task_dir, config)
    task_id = _task_id(task_dir, config)
    env_dir = task_dir / "environment"
    image_name = str(config.environment.docker_image or "")
    if build:
        if build_missing_images is None:
            from polar_client.settings import ClientSettings

            build_missing_images = ClientSettings().build_missing_images
        built = build_environment(env_dir, name=task_id, out_dir=task_dir / BUILD_DIR, docker_image=image_name,
                                  docker_host=docker_host, client=docker_client,
                                  timeout_s=float(config.environment.build_timeout_sec),
                                  build_missing_image=build_missing_images)  # fmt: skip
        image, workdir, base = built.image, built.workdir, built.workdir_dir
    else:
        content = context_hash(env_dir, docker_image=image_name)
        image, workdir, base = image_tags(task_id, content)[1], "/app", task_dir / BUILD_DIR / content[:16] / "workdir"
    verifier_s = float(config.verifier.timeout_sec)
    if not math.isfinite(verifier_s) or verifier_s <= 0:
        raise _refuse(task_dir, "task.toml verifier.timeout_sec", "must be a positive number")
    mapping: dict[str, Any] = {
        "task_id": task_id,
        "instruction": instruction,
        "num_samples": 1,
        "runtime": {"kind": "docker", "image": image},
        "metadata": {"repo": str(base), "harbor": {"task_dir": str(task_dir), "image": image, "workdir": workdir}},
        "evaluator": {
            "strategy": "harbor",
            "repo": str(base),
            "tests_dir": str(tests_dir),
            "workdir": workdir,
            "verifier_timeout_seconds": verifier_s,
            "timeout_seconds": verifier_s + _VERIFIER_GRACE_S,
            "env": {str(k): str(v) for k, v in config.verifier.env.items()},
        },
    }
    if config.agent.timeout_sec:
        mapping["timeout_seconds"] = float(config.agent.timeout_sec)
    mapping.update(_polar_fields(task_dir, config))
    return mapping


def task_mappings(path: Path, **opts: Any) -> list[dict[str, Any]]:
    """The task mappings of a Harbor task directory, or of a directory of them (sorted by directory name).

    ``opts`` go to :func:`task_mapping`.

    Raises:
        InvalidArgument: ``path`` holds no Harbor task, or one of them is refused (see :func:`task_mapping`).
    """
    if detect(path):
        return [task_mapping(path, **opts)]
    if not is_dataset(path):
        raise InvalidArgument(f"{path} is neither a Harbor task directory nor a directory of them",
                              details={"field": "task.toml"})  # fmt: skip
    return [task_mapping(p.parent, **opts) for p in sorted(path.glob("*/task.toml")) if p.is_file()]


def built_image(task: Mapping[str, Any]) -> str:
    """The environment image a Harbor task mapping's build made (``""`` for any other task)."""
    metadata = task.get("metadata")
    harbor = metadata.get("harbor") if isinstance(metadata, Mapping) else None
    return str(harbor.get("image") or "") if isinstance(harbor, Mapping) else ""
