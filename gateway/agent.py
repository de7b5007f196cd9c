"""The real agent runner and runtime factory: harness adapters launched inside :mod:`runtimes` sandboxes.

:class:`HarnessAgentRunner` implements :class:`gateway.ports.AgentRunner`: it lays out the workspace (the tree
of the task's repository at its base commit, without history, committed once as the initial state), asks the
harness adapter for its launch, writes the adapter's files below ``HOME``, runs the command under the agent
budget, and afterwards collects the workspace patch (against the base kept on the gateway's host, see
:mod:`gateway.workspace`) and any named files for the evaluator. :class:`SpecRuntimeFactory` implements
:class:`gateway.ports.RuntimeFactory` over :func:`runtimes.create_runtime`.

Task keys read here (free-form ``metadata``, so neither the harness nor the evaluator options need them):
``metadata.repo`` / ``metadata.base_commit`` (or the ``evaluator.options`` keys): the workspace's base, see
:mod:`gateway.workspace`;
``metadata.workspace_image_path``: instead, a directory inside the runtime's image the workspace is seeded from
(``/testbed`` of a SWE-bench image), see :mod:`gateway.workspace`;
``metadata.artifact_paths``: files (relative to the workspace) sent to the evaluator besides the patch.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from gateway.errors import PatchTooLarge
from gateway.harness_check import check_program
from gateway.harnesses import (
    HarnessAdapter,
    HarnessContext,
    HarnessLaunch,
    adapter_names,
    get_adapter,
    rebase_endpoints,
)
from gateway.harnesses.patch import PATCH_SCRIPT, init_workspace_argv
from gateway.models import AgentRun, Artifacts, ProxyEndpoints, SessionSpec
from gateway.ports import PreparedAgent
from gateway.tunnel import ProxyTunnel
from gateway.workspace import (
    WorkspaceBase,
    image_base,
    image_source,
    require_image,
    seed_argv,
    validate_repository,
    workspace_base,
)
from polar_core.errors import FailedPrecondition, Internal, InvalidArgument, NotFound
from polar_core.git_trees import TreeCache
from polar_core.records import AgentStatus
from polar_core.task_paths import check_task_paths
from runtimes import ExecResult, NetworkMode, Runtime, RuntimeFactory, RuntimeSpec
from runtimes.editable import redirect_editables
from runtimes.sandbox_policy import OperatorPolicy, apply_task_runtime

__all__ = ["HarnessAgentRunner", "PreparedHarness", "SpecRuntimeFactory"]

_SETUP_TIMEOUT_S = 120.0
_SEED_TIMEOUT_S = 600.0  # copying a large repository out of the image (django's tree: tens of MB)
_PATCH_FILE = ".polar/agent.patch"
MAX_PATCH_BYTES = 64 * 1024 * 1024
"""The largest workspace patch collected; a bigger one (or a bigger file in the workspace) is ``invalid_patch``."""
_PATCH_TOO_LARGE_EXIT = 3
# $1 the patch script, $2-$4 its arguments, $5 the output file, $6 the byte limit. A file over the limit is
# refused before git reads it; the patch is cut at limit+1 bytes, so the output never grows past that. The base
# pack ($4) is removed in the same command (each sandboxed command costs a bwrap and a tunnel forwarder start).
_COLLECT_SCRIPT = f"""big=$(find "$2" -path "$2/.git" -prune -o -type f -size +"$6"c -print | head -n 1)
if [ -n "$big" ]; then
  echo "the file ${{big#"$2"/}} is larger than the patch limit ($6 bytes)" >&2; exit {_PATCH_TOO_LARGE_EXIT}
fi
(sh -c "$1" polar-patch "$2" "$3" "$4"; echo $? > "$5.rc") | head -c "$(($6 + 1))" > "$5"
[ -z "$4" ] || rm -f -- "$4"
size=$(wc -c < "$5")
if [ "$size" -gt "$6" ]; then
  echo "the patch is larger than the patch limit ($6 bytes)" >&2; exit {_PATCH_TOO_LARGE_EXIT}
fi
rc=$(cat "$5.rc"); rm -f "$5.rc"; exit "$rc"
"""
# Bases of prepared sessions not yet collected; a session that never reaches collect leaves one small entry.
_MAX_BASES = 4096
# A made-up session used to check a task's harness options at admission (adapters are pure).
_CHECK_ROOT = PurePosixPath("/polar-admission-check")
_CHECK_ENDPOINTS = ProxyEndpoints(
    token="check",
    anthropic_base_url="http://127.0.0.1:1",
    openai_base_url="http://127.0.0.1:1/v1",
    google_base_url="http://127.0.0.1:1",
)


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedHarness:
    """A harness whose files are written and whose launch is known."""

    harness: str
    launch: HarnessLaunch
    workspace: PurePosixPath


class HarnessAgentRunner:
    """Runs harness adapters inside runtimes.

    Args:
        workspace_dir: The workspace, relative to the runtime's session directory.
        bin_dir: Directory (inside the runtime) holding installed CLIs; prepended to ``PATH``.
        adapters: Returns the adapter of a harness name (tests inject their own).
        names: The harness names ``adapters`` knows.
        tunnel: The gateway's proxy tunnel; runtimes with ``network: proxy`` on its socket get it started and
            their endpoints rebased to the in-sandbox forwarder.
        max_patch_bytes: The patch limit (:data:`MAX_PATCH_BYTES`): over it, collect raises PatchTooLarge.
        default_model: Model name given to the harness when the task names none.
        trees: Where base trees are exported and packed (by default a private directory per user below the
            temporary directory).
        check_programs: Refuse at admission a ``local``-runtime task whose harness program is not on this host
            (:func:`gateway.harness_check.check_program`).
        task_roots: Host directories the task's repository and test-patch paths must lie under
            (:func:`polar_core.task_paths.check_task_paths`); ``None`` checks nothing (tests and fakes).
    """

    def __init__(
        self,
        *,
        workspace_dir: str = "workspace",
        bin_dir: PurePosixPath | None = None,
        adapters: Callable[[str], HarnessAdapter] = get_adapter,
        names: tuple[str, ...] | None = None,
        tunnel: ProxyTunnel | None = None,
        default_model: str = "policy",
        trees: TreeCache | None = None,
        check_programs: bool = False,
        max_patch_bytes: int = MAX_PATCH_BYTES,
        task_roots: Sequence[Path] | None = None,
    ) -> None:
        self._task_roots = tuple(task_roots) if task_roots is not None else None
        self._check_programs = check_programs
        self._max_patch_bytes = max_patch_bytes
        self._default_model = default_model
        self._trees = trees if trees is not None else TreeCache()
        self._bases: collections.OrderedDict[tuple[str, int], WorkspaceBase] = collections.OrderedDict()
        self._workspace_dir = workspace_dir
        self._bin_dir = bin_dir
        self._adapters = adapters
        self._names = frozenset(names if names is not None else adapter_names())
        self._tunnel = tunnel

    def validate(self, spec: SessionSpec) -> None:
        """Check the harness name, its options (a dry run of the pure adapter) and the metadata keys read here.

        Raises:
            InvalidArgument: Something in the task would make the session fail at INIT, or a host path of the
                task is not under the operator's task roots.
            FailedPrecondition: The harness's CLI is not installed on this gateway (with ``check_programs``).
        """
        if self._task_roots is not None:
            check_task_paths(
                {"metadata": dict(spec.metadata), "evaluator": {"options": dict(spec.evaluator.options)}},
                self._task_roots,
            )
        name = spec.harness.name
        if name not in self._names:
            raise InvalidArgument(
                f"unknown harness {name!r}; known: {', '.join(sorted(self._names))}", details={"harness": name}
            )
        ctx = HarnessContext(
            home=_CHECK_ROOT / "home",
            workspace=_CHECK_ROOT / self._workspace_dir,
            tmp=_CHECK_ROOT / "tmp",
            instruction=spec.instruction,
            endpoints=_CHECK_ENDPOINTS,
            model=spec.model or "check",
            options=dict(spec.harness.options),
            bin_dir=self._bin_dir,
            session_id=spec.session_id,
            sample_index=spec.sample_index,
        )
        try:
            launch = self._adapters(name).prepare(ctx)
        except InvalidArgument:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidArgument(f"invalid options for harness {name!r}: {exc}", details={"harness": name}) from None
        if self._check_programs and spec.runtime.kind in ("", "local") and not spec.runtime.image:
            check_program(name, launch, session_root=_CHECK_ROOT)
        _string_list(spec.metadata.get("artifact_paths"))
        validate_repository(spec, self._trees)

    async def _sandbox_endpoints(self, runtime: Runtime, endpoints: ProxyEndpoints) -> ProxyEndpoints:
        """The endpoints as the harness inside ``runtime`` reaches them (through the tunnel in proxy mode)."""
        runtime_spec = getattr(runtime, "spec", None)
        if not isinstance(runtime_spec, RuntimeSpec) or runtime_spec.network is not NetworkMode.PROXY:
            return endpoints
        if self._tunnel is not None and runtime_spec.proxy_socket == self._tunnel.socket_path:
            endpoints = await self._tunnel.attach(endpoints)
        # An operator-provided socket: the operator's bridge reaches the proxy; only the origin changes.
        return rebase_endpoints(endpoints, f"http://127.0.0.1:{runtime_spec.proxy_port}")

    async def prepare(self, runtime: Runtime, spec: SessionSpec, endpoints: ProxyEndpoints) -> PreparedHarness:
        """Lay out the workspace and the harness's files; see :class:`gateway.ports.AgentRunner`."""
        endpoints = await self._sandbox_endpoints(runtime, endpoints)
        workspace = runtime.root / self._workspace_dir
        base = await self._lay_out(runtime, spec, workspace)
        self._bases[(spec.session_id, spec.attempt)] = base
        while len(self._bases) > _MAX_BASES:
            self._bases.popitem(last=False)
        ctx = HarnessContext(
            home=runtime.root / "home",
            workspace=workspace,
            tmp=runtime.root / "tmp",
            instruction=spec.instruction,
            endpoints=endpoints,
            # The same fallback the pipeline uses when it opens the proxy session.
            model=spec.model or self._default_model,
            options=dict(spec.harness.options),
            bin_dir=self._bin_dir,
            session_id=spec.session_id,
            sample_index=spec.sample_index,
        )
        launch = self._adapters(spec.harness.name).prepare(ctx)
        for rel, content in launch.files.items():
            data = content.encode("utf-8") if isinstance(content, str) else content
            await runtime.upload(data, f"home/{rel}")
        return PreparedHarness(spec.harness.name, launch, workspace)

    async def _lay_out(self, runtime: Runtime, spec: SessionSpec, workspace: PurePosixPath) -> WorkspaceBase:
        """Make the workspace (from the host repository, the image's directory, or empty) and commit it once."""
        image_path = image_source(spec)
        if image_path:
            require_image(runtime, image_path)
            what = f"copying {image_path} of the image into the workspace"
            await _check(runtime, seed_argv(image_path, workspace), what, timeout_s=_SEED_TIMEOUT_S)
            await _check(runtime, init_workspace_argv(workspace), "committing the initial workspace")
            # The image's editable installs of the directory import from the workspace, so the agent's own test
            # runs see its edits (and not the image's unchanged copy).
            await redirect_editables(runtime, image_path, workspace)
            return await image_base(runtime, workspace, self._trees)
        base = await asyncio.to_thread(workspace_base, spec, self._trees)
        if base.directory is not None:
            await runtime.upload(base.directory, self._workspace_dir)
        else:
            await _check(runtime, ["mkdir", "-p", str(workspace)], "creating the workspace")
        await _check(runtime, init_workspace_argv(workspace), "committing the initial workspace")
        return base

    async def run(self, runtime: Runtime, prepared: PreparedAgent, *, timeout_s: float) -> AgentRun:
        """Run the harness; the runtime kills its process tree at ``timeout_s``."""
        if not isinstance(prepared, PreparedHarness):
            raise Internal(f"cannot run a {type(prepared).__name__}")
        launch = prepared.launch
        result = await runtime.exec(list(launch.argv), cwd=launch.cwd, env=dict(launch.env), timeout=timeout_s)
        if result.timed_out:
            outcome = AgentStatus.TIMEOUT
        elif result.exit_code == 0:
            outcome = AgentStatus.COMPLETED
        else:
            outcome = AgentStatus.ERROR
        return AgentRun(outcome, result.exit_code, result.stdout, result.stderr, result.duration_s)

    async def collect(self, runtime: Runtime, spec: SessionSpec, run: AgentRun) -> Artifacts:
        """Return the workspace patch and the files named by ``metadata.artifact_paths``."""
        workspace = runtime.root / self._workspace_dir
        out = runtime.root / _PATCH_FILE
        base = self._bases.pop((spec.session_id, spec.attempt), None)
        if base is None:
            base = await asyncio.to_thread(workspace_base, spec, self._trees)
        # Uploaded only now, after the agent ended, under a fresh name: the agent never had it to change.
        pack = ""
        if base.pack is not None:
            pack = str(runtime.root / f".polar/base-{uuid.uuid4().hex}.pack")
            await runtime.upload(base.pack, pack)
        # Written to a file and downloaded, because exec output is truncated and decoded as text.
        argv = ["sh", "-c", _COLLECT_SCRIPT, "polar-collect", PATCH_SCRIPT, str(workspace), base.tree, pack, str(out),
                str(self._max_patch_bytes)]  # fmt: skip
        result = await runtime.exec(argv, timeout=_SETUP_TIMEOUT_S)
        if result.exit_code == _PATCH_TOO_LARGE_EXIT and not result.timed_out:
            raise PatchTooLarge(result.stderr.strip()[-500:] or "the patch is larger than the patch limit")
        _raise_unless_ok(result, "collecting the workspace patch")
        patch = await runtime.download(out)
        files: dict[str, bytes] = {}
        for rel in _string_list(spec.metadata.get("artifact_paths")):
            try:
                files[rel] = await runtime.download(workspace / rel)
            except NotFound:
                continue  # the agent did not produce it; the evaluator decides what that means
        return Artifacts(patch=patch or None, files=files)


async def _check(runtime: Runtime, argv: list[str], what: str, *, timeout_s: float = _SETUP_TIMEOUT_S) -> None:
    _raise_unless_ok(await runtime.exec(argv, timeout=timeout_s), what)


def _raise_unless_ok(result: ExecResult, what: str) -> None:
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        raise FailedPrecondition(f"{what} failed (exit {result.exit_code}): {detail}")


def _string_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument("metadata.artifact_paths must be a list of strings")
    return list(value)


@dataclasses.dataclass
class SpecRuntimeFactory:
    """Builds each session's runtime from the operator's options narrowed by its task's ``runtime`` table.

    The task's table goes through :func:`runtimes.sandbox_policy.apply_task_runtime`: it may narrow what the operator
    allows (network, isolation, limits, paths), never widen it.

    Attributes:
        inner: The runtimes package's factory.
        default_kind: Kind used when the task leaves it unspecified.
        defaults: The operator's runtime options (``network``, ``read_only_paths``, ``isolation``, ...).
        tunnel: The gateway's proxy tunnel: a ``network: proxy`` runtime without its own ``proxy_socket`` gets
            the tunnel's socket and sandbox port.
        policy: What tasks may ask for beyond the operator's options (minimum isolation, read-only roots,
            images).
    """

    inner: RuntimeFactory
    default_kind: str = "local"
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tunnel: ProxyTunnel | None = None
    policy: OperatorPolicy = dataclasses.field(default_factory=OperatorPolicy)

    def runtime_spec(self, spec: SessionSpec) -> RuntimeSpec:
        """The runtime spec of a session.

        Raises:
            InvalidArgument: The task's runtime table is malformed or widens the operator's policy.
        """
        operator: dict[str, Any] = {**self.defaults, "kind": self.default_kind}
        if self.tunnel is not None and not operator.get("proxy_socket"):
            # Also when the operator's network is narrower: a proxy-mode task then fails the network check.
            operator["proxy_socket"] = self.tunnel.socket_path
            operator.setdefault("proxy_port", self.tunnel.sandbox_port)
        table: dict[str, Any] = dict(spec.runtime.options)
        if spec.runtime.kind:
            table["kind"] = spec.runtime.kind
        if spec.runtime.image:
            table["image"] = spec.runtime.image
        return apply_task_runtime(self.policy, operator, table)

    def validate(self, spec: SessionSpec) -> None:
        """Check the task's runtime table at admission.

        Raises:
            InvalidArgument: The table is malformed or widens the operator's policy.
        """
        self.runtime_spec(spec)

    def create(self, spec: SessionSpec) -> Runtime:
        """Return the unstarted runtime of ``spec``.

        Raises:
            InvalidArgument: The task's runtime table is malformed or widens the operator's policy.
        """
        return self.inner.create(self.runtime_spec(spec), session_id=spec.session_id)
