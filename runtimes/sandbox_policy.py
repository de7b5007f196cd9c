"""The operator's policy over a task's ``runtime`` table: a task may narrow what the operator allows, never widen it.

Every service that builds a runtime from a task (the gateway for the agent, the evaluator for tests, the rollout
server when it checks a submission) calls :func:`apply_task_runtime`. The operator's options (its settings) are the
baseline; the task's table may only:

* ``network``: pick the same or a narrower mode (``host`` > ``proxy`` > ``none``);
* ``isolation``: ask for the same or stronger (``bwrap`` > ``unshare`` > ``none``), never below the operator's
  ``min_isolation``; ``auto`` keeps the operator's choice;
* limits (``memory_limit``, ``pids_limit``, ``cpu_time_limit_s``, ``file_size_limit``, ``cpus``, ``tmp_size``,
  ``disk_limit``): the same or smaller (``None``, unlimited, only where the operator's is unlimited too);
* ``read_only_paths``: add paths that resolve (after symlinks) under the operator's ``read_only_roots`` or its own
  read-only paths; the operator's paths always stay;
* ``env``: add variables, except those the runtimes and the gateway set themselves (:data:`RESERVED_ENV`, any
  ``LD_*`` or ``POLAR_*``, and ``*_PROXY``, ``*_BASE_URL``, ``*_API_BASE``, ``*_API_KEY`` ones);
* ``image``: one the operator's image or one of its ``images`` glob patterns names;
* ``kind``: a container runtime (``docker``, ``apptainer``) instead of the operator's, never ``local`` instead of
  a container; ``read_only_root``: only ``true``; ``proxy_port``: any.

``proxy_socket``, ``docker_host``, ``container_root``, ``sandbox_uid``, ``sandbox_gid`` and ``min_isolation`` come
from the operator only. Anything else raises :class:`polar_core.errors.InvalidArgument` naming the field.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polar_core.errors import InvalidArgument
from polar_core.task_paths import check_task_paths
from runtimes._limits import parse_size
from runtimes.spec import Isolation, NetworkMode, RuntimeKind, RuntimeSpec

__all__ = ["OPERATOR_ONLY", "RESERVED_ENV", "OperatorPolicy", "TaskAdmission", "apply_task_runtime", "is_under"]

CHECK_SOCKET = "/run/polar/admission-check.sock"
"""A stand-in proxy socket for checking tables where no tunnel exists (the rollout server, ``polar run``)."""

OPERATOR_ONLY = frozenset({"proxy_socket", "docker_host", "container_root", "sandbox_uid", "sandbox_gid",
                           "min_isolation"})  # fmt: skip
"""Runtime options a task may never set."""

RESERVED_ENV = frozenset({"PATH", "HOME", "TMPDIR", "LANG", "SHELL", "USER", "LOGNAME", "PYTHONHOME", "BASH_ENV",
                          "ENV", "NODE_OPTIONS", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM"})  # fmt: skip
"""Environment variables a task may not set (besides the prefixes and suffixes in the module docstring)."""

_RESERVED_PREFIXES = ("LD_", "POLAR_")
_RESERVED_SUFFIXES = ("_PROXY", "_BASE_URL", "_API_BASE", "_API_KEY", "_AUTH_TOKEN")
_NETWORK_RANK = {NetworkMode.NONE: 0, NetworkMode.PROXY: 1, NetworkMode.HOST: 2}
_SIZES = ("memory_limit", "file_size_limit", "tmp_size")
_COUNTS = ("pids_limit", "cpu_time_limit_s", "cpus")
_CONTAINERS = tuple(kind for kind in RuntimeKind if kind.runs_image)


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorPolicy:
    """What an operator allows tasks, beyond its own runtime options.

    Attributes:
        min_isolation: The weakest local isolation allowed (``bwrap`` by default; ``unshare``/``none`` only when
            the operator says so). Never ``auto``.
        read_only_roots: Host directories under which a task may name extra ``read_only_paths``.
        images: Glob patterns (``fnmatch``) of images a task may name besides the operator's own image.
    """

    min_isolation: Isolation = Isolation.BWRAP
    read_only_roots: tuple[Path, ...] = ()
    images: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.min_isolation is Isolation.AUTO:
            raise InvalidArgument("min_isolation must be gvisor, bwrap, unshare or none")


def is_under(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path``, with every symlink resolved, lies in (or is) one of ``roots`` (resolved too)."""
    real = Path(os.path.realpath(path))
    for root in roots:
        base = Path(os.path.realpath(root))
        if real == base or base in real.parents:
            return True
    return False


def apply_task_runtime(policy: OperatorPolicy, operator: Mapping[str, Any], table: Mapping[str, Any]) -> RuntimeSpec:
    """The runtime spec of a task: the operator's options, narrowed by the task's ``runtime`` table.

    Args:
        policy: What the operator allows beyond its options.
        operator: The operator's runtime options (:meth:`RuntimeSpec.from_mapping` keys; ``kind`` and ``image``
            are its defaults).
        table: The task's runtime table, with the task's ``kind`` and ``image`` when it names them.

    Raises:
        InvalidArgument: The table is malformed or widens what the operator allows (the message names the field).
    """
    task = dict(table)
    for key in sorted(OPERATOR_ONLY & set(task)):
        raise InvalidArgument(f"runtime.{key} is set by the operator, not by a task", details={"field": key})
    base_options = {k: v for k, v in operator.items() if k not in ("kind", "image")}
    base = RuntimeSpec.from_mapping(base_options)
    if "network" in task:
        try:
            network = NetworkMode(task["network"])
        except ValueError as exc:
            raise InvalidArgument(f"invalid runtime option: {exc}", details={"field": "network"}) from None
        if _NETWORK_RANK[network] > _NETWORK_RANK[base.network]:
            raise _widen("network", network.value, f"the operator allows at most {base.network.value!r}")
    # Parsed once on its own, so every value is checked and typed before it is compared.
    parsed = RuntimeSpec.from_mapping(
        {k: v for k, v in task.items() if k not in ("kind", "image")},
        **{k: v for k, v in base_options.items() if k in ("proxy_socket", "network")},
    )
    changes: dict[str, Any] = {"min_isolation": _stronger(policy.min_isolation, base.min_isolation)}
    _check_kind_and_image(policy, operator, task, changes)
    if "network" in task:
        changes["network"] = parsed.network
    if "isolation" in task and parsed.isolation is not Isolation.AUTO:
        floor = _stronger(changes["min_isolation"], base.isolation)
        if parsed.isolation.rank < floor.rank:
            raise _widen("isolation", parsed.isolation.value, f"the operator requires at least {floor.value!r}")
        changes["isolation"] = parsed.isolation
    for name in _SIZES:
        if name in task:
            if parse_size(getattr(parsed, name)) > parse_size(getattr(base, name)):
                raise _widen(name, getattr(parsed, name), f"the operator allows at most {getattr(base, name)!r}")
            changes[name] = getattr(parsed, name)
    for name in _COUNTS:
        if name in task:
            mine, theirs = getattr(parsed, name), getattr(base, name)
            if theirs is not None and (mine is None or mine > theirs):
                raise _widen(name, mine, f"the operator allows at most {theirs!r}")
            changes[name] = mine
    if "disk_limit" in task:
        mine_disk, their_disk = parsed.disk_limit, base.disk_limit
        if their_disk is not None and (mine_disk is None or parse_size(mine_disk) > parse_size(their_disk)):
            raise _widen("disk_limit", mine_disk, f"the operator allows at most {their_disk!r}")
        changes["disk_limit"] = mine_disk
    if "read_only_root" in task:
        if base.read_only_root and not parsed.read_only_root:
            raise _widen("read_only_root", False, "the operator requires a read-only root file system")
        changes["read_only_root"] = parsed.read_only_root
    if "proxy_port" in task:
        changes["proxy_port"] = parsed.proxy_port
    if "read_only_paths" in task:
        changes["read_only_paths"] = _read_only_paths(policy, base, parsed.read_only_paths)
    if "env" in task:
        for key in parsed.env:
            if _reserved(key):
                raise InvalidArgument(
                    f"runtime.env may not set {key!r}: it is reserved for the runtime and the gateway",
                    details={"field": f"env.{key}"},
                )
        changes["env"] = {**base.env, **parsed.env}
    merged = {f.name: getattr(base, f.name) for f in dataclasses.fields(RuntimeSpec)} | changes
    return RuntimeSpec(**merged)


def _check_kind_and_image(
    policy: OperatorPolicy, operator: Mapping[str, Any], task: Mapping[str, Any], changes: dict[str, Any]
) -> None:
    try:
        default_kind = RuntimeKind(operator.get("kind") or RuntimeKind.LOCAL)
        kind = RuntimeKind(task.get("kind") or default_kind)
    except ValueError as exc:
        raise InvalidArgument(f"invalid runtime option: {exc}", details={"field": "kind"}) from None
    if kind is not default_kind and kind not in _CONTAINERS:
        raise _widen("kind", kind.value, f"the operator runs {default_kind.value!r} runtimes")
    own_image = str(operator.get("image") or "")
    image = str(task.get("image") or "") or own_image
    if image and image != own_image and not any(fnmatch.fnmatchcase(image, p) for p in policy.images):
        raise _widen("image", image, "the operator's image patterns do not allow it")
    changes["kind"] = kind
    changes["image"] = image


def _read_only_paths(policy: OperatorPolicy, base: RuntimeSpec, extra: Sequence[Path]) -> tuple[Path, ...]:
    roots = (*policy.read_only_roots, *base.read_only_paths)
    paths = list(base.read_only_paths)
    for path in extra:
        if not path.is_absolute() or not is_under(path, roots):
            raise InvalidArgument(
                f"runtime.read_only_paths: {str(path)!r} is not under a directory the operator allows "
                f"({', '.join(map(str, roots)) or 'none'})",
                details={"field": "read_only_paths"},
            )
        if path not in paths:
            paths.append(path)
    return tuple(paths)


def _reserved(key: str) -> bool:
    upper = key.upper()
    return upper in RESERVED_ENV or upper.startswith(_RESERVED_PREFIXES) or upper.endswith(_RESERVED_SUFFIXES)


def _stronger(a: Isolation, b: Isolation) -> Isolation:
    """The stronger of two levels (``auto`` counts as no requirement)."""
    if b is Isolation.AUTO:
        return a
    return a if a.rank >= b.rank else b


def _widen(field: str, value: Any, why: str) -> InvalidArgument:
    return InvalidArgument(f"runtime.{field} = {value!r} widens the sandbox: {why}", details={"field": field})


@dataclasses.dataclass(frozen=True, slots=True)
class TaskAdmission:
    """The whole-task check run before a task is recorded (the rollout server's SubmitTask, ``polar run`` and
    ``polar generate``): host paths under the task roots, and the agent's and the evaluator's runtime tables within
    the operator's policy. The gateway and the evaluator check the same again on their own settings.

    Attributes:
        policy: What the operator allows beyond its options.
        task_roots: Directories the task's repository and test-patch paths must lie under.
        agent: The operator's options for agent runtimes (the gateway's: ``network``, ...).
        evaluator: The operator's options for evaluation runtimes (the evaluator's).
    """

    policy: OperatorPolicy
    task_roots: tuple[Path, ...]
    agent: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    evaluator: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        task_roots: Sequence[Path],
        network: str = NetworkMode.PROXY.value,
        min_isolation: str = Isolation.BWRAP.value,
        read_only_roots: Sequence[Path] = (),
        images: Sequence[str] = (),
    ) -> TaskAdmission:
        """The check for a fleet whose gateways run ``network`` and whose services share these settings."""
        agent: dict[str, Any] = {"network": network}
        if network == NetworkMode.PROXY.value:
            agent["proxy_socket"] = CHECK_SOCKET
        return cls(
            OperatorPolicy(Isolation(min_isolation), tuple(read_only_roots), tuple(images)), tuple(task_roots), agent
        )

    def check(self, task: Mapping[str, Any]) -> None:
        """Check a task in the task file's shape (``runtime: {kind, image, ...}``, ``evaluator: {strategy, ...}``).

        Raises:
            InvalidArgument: A host path outside the task roots, or a runtime table that widens the policy.
        """
        check_task_paths(task, self.task_roots)
        runtime = task.get("runtime")
        if runtime is not None and not isinstance(runtime, Mapping):
            raise InvalidArgument("runtime must be a mapping")
        agent_table = dict(runtime or {})
        apply_task_runtime(self.policy, self.agent, agent_table)
        evaluator = task.get("evaluator")
        if not isinstance(evaluator, Mapping):
            return
        nested = evaluator.get("options")
        options: Mapping[str, Any] = nested if isinstance(nested, Mapping) else evaluator
        table = options.get("runtime")
        image = agent_table.get("image") if agent_table.get("kind") in _CONTAINER_NAMES else None
        if table is None and not image:
            return
        if table is not None and not isinstance(table, Mapping):
            raise InvalidArgument("evaluator.runtime must be a mapping")
        table = dict(table or {})
        if image:
            table.setdefault("kind", RuntimeKind.DOCKER.value)
            table["image"] = image
        try:
            apply_task_runtime(self.policy, self.evaluator, table)
        except InvalidArgument as exc:
            raise InvalidArgument(f"evaluator: {exc.message}", details=exc.details) from None


_CONTAINER_NAMES = tuple(kind.value for kind in _CONTAINERS)
