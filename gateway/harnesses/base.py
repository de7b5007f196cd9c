"""The harness seam: how one agent CLI is pointed at the model proxy and launched.

An adapter is pure: :meth:`HarnessAdapter.prepare` turns a :class:`HarnessContext` (paths as the runtime sees
them, the proxy endpoints, the instruction) into a :class:`HarnessLaunch` (argv, the complete environment and
the configuration files to write below ``home``). It starts nothing and touches no file; the gateway's agent
runner writes the files into the runtime and runs the command there, so adapters work the same for every
runtime kind and can be unit-tested without ports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from gateway.models import ProxyEndpoints
from polar_core.errors import InvalidArgument

__all__ = [
    "DEFAULT_PATH",
    "HarnessAdapter",
    "HarnessContext",
    "HarnessLaunch",
    "ProxyEndpoints",
    "base_environment",
    "finish_environment",
    "rebase_endpoints",
    "require",
    "string_list",
    "with_suffix",
    "without_suffix",
]

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# Options every adapter accepts: ``env`` (extra variables, applied last) and ``extra_args`` (appended to argv).


@dataclasses.dataclass(frozen=True, slots=True)
class HarnessContext:
    """Everything an adapter needs to know about one session, with paths as seen inside the runtime.

    Attributes:
        home: The harness's ``HOME``; configuration files go below it.
        workspace: The working directory (a git repository whose first commit is the task's initial state).
        tmp: The harness's ``TMPDIR``.
        instruction: The task instruction given to the agent as its prompt.
        endpoints: Proxy base URLs reachable from inside the runtime, and the session token.
        model: The model name the harness asks for.
        options: The task file's harness options (adapter-specific; unknown keys are rejected).
        bin_dir: Directory holding the installed CLIs (``.harnesses/node_modules/.bin``); prepended to ``PATH``.
        path: The rest of ``PATH`` (where ``node``, ``git`` and a shell live).
        session_id: The session's id (only the ``command`` harness passes it on, as ``POLAR_SESSION_ID``).
        sample_index: The session's index among its task's samples (``POLAR_SAMPLE_INDEX`` for ``command``).
    """

    home: PurePosixPath
    workspace: PurePosixPath
    tmp: PurePosixPath
    instruction: str
    endpoints: ProxyEndpoints
    model: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    bin_dir: PurePosixPath | None = None
    path: str = DEFAULT_PATH
    session_id: str = ""
    sample_index: int = 0

    def option(self, key: str, default: Any = None) -> Any:
        """An option's value, or ``default`` when it is absent."""
        return self.options.get(key, default)


@dataclasses.dataclass(frozen=True, slots=True)
class HarnessLaunch:
    """How to launch a prepared harness.

    Attributes:
        argv: The command line (the program is a name looked up on ``env["PATH"]`` or an absolute path).
        env: The complete environment of the process (nothing else is inherited).
        cwd: Working directory (the workspace).
        files: Configuration files to write before launch: path relative to ``home`` → contents.
        log_paths: Files or directories (absolute, inside the runtime) holding the harness's own logs and
            session transcripts; collected as artifacts after the run.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: PurePosixPath
    files: Mapping[str, bytes | str] = dataclasses.field(default_factory=dict)
    log_paths: tuple[PurePosixPath, ...] = ()


@runtime_checkable
class HarnessAdapter(Protocol):
    """Points one agent CLI at the proxy; implementations live one module per harness."""

    @property
    def name(self) -> str:
        """The harness name used in task files (``claude-code``, ``codex``, ...)."""
        ...

    @property
    def option_names(self) -> frozenset[str]:
        """The adapter's own option keys (besides ``COMMON_OPTIONS``): its entry in
        :data:`polar_checks.harnesses.HARNESS_OPTIONS`, which the client and the rollout server check a task against.
        """
        ...

    @property
    def artifacts(self) -> str:
        """A sentence describing what the harness leaves behind besides the workspace patch."""
        ...

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch for ``ctx``; pure (no I/O).

        Raises:
            InvalidArgument: An option is unknown or malformed, or a needed endpoint is missing.
        """
        ...


def _string_map(harness: str, key: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidArgument(f"option {key!r} of harness {harness!r} must be a mapping", details={"harness": harness})
    return {k: str(v) for k, v in value.items()}


def string_list(harness: str, key: str, value: Any) -> list[str]:
    """Validate a list-of-strings option (``None`` is an empty list).

    Raises:
        InvalidArgument: The value is not a list of strings.
    """
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(
            f"option {key!r} of harness {harness!r} must be a list of strings", details={"harness": harness}
        )
    return list(value)


def base_environment(ctx: HarnessContext, harness: str) -> dict[str, str]:
    """The environment every harness starts from: its own HOME/TMPDIR, a fixed PATH, no colours, no tracking."""
    path = f"{ctx.bin_dir}:{ctx.path}" if ctx.bin_dir is not None else ctx.path
    return {
        "HOME": str(ctx.home),
        "TMPDIR": str(ctx.tmp),
        "PATH": path,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "DO_NOT_TRACK": "1",
        "POLAR_HARNESS": harness,
    }


def finish_environment(env: dict[str, str], ctx: HarnessContext, harness: str) -> dict[str, str]:
    """Apply the task's ``env`` option last, so a task can override anything."""
    env.update(_string_map(harness, "env", ctx.option("env")))
    return env


def require(harness: str, url: str, what: str) -> str:
    """Return ``url``, or raise when the proxy did not provide that endpoint.

    Raises:
        InvalidArgument: ``url`` is empty.
    """
    if not url:
        raise InvalidArgument(f"harness {harness!r} needs the proxy's {what} base URL", details={"harness": harness})
    return url


def without_suffix(url: str, suffix: str) -> str:
    """``url`` without a trailing slash and without the path ``suffix`` (``/v1``), if it ends with it."""
    url = url.rstrip("/")
    return url[: -len(suffix)] if url.endswith(suffix) else url


def with_suffix(url: str, suffix: str) -> str:
    """``url`` ending in exactly one path ``suffix`` (``/v1``), whichever convention the proxy used."""
    return without_suffix(url, suffix) + suffix


def rebase_endpoints(endpoints: ProxyEndpoints, origin: str) -> ProxyEndpoints:
    """Replace scheme, host and port of every base URL with ``origin``, keeping the paths.

    The proxy reports URLs as the host sees them; inside a sandbox the proxy is reached through a tunnel
    (``http://127.0.0.1:<port>``), so the gateway rebases them before calling :meth:`HarnessAdapter.prepare`.
    """
    target = urlsplit(origin)

    def one(url: str) -> str:
        if not url:
            return url
        parts = urlsplit(url)
        return urlunsplit((target.scheme, target.netloc, parts.path, parts.query, parts.fragment))

    return dataclasses.replace(
        endpoints,
        anthropic_base_url=one(endpoints.anthropic_base_url),
        openai_base_url=one(endpoints.openai_base_url),
        google_base_url=one(endpoints.google_base_url),
    )
