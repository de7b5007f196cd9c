"""Telling a harness's own failures from the policy's: which agent runs end ``infra_error`` instead of being scored.

Two kinds of RUN are not the policy's doing and are never evaluated:

* a harness that exits non-zero before its first model call (it could not start: a missing CLI, a bad
  configuration, a crash at start-up) — the message carries its exit code and the tail of its stderr;
* a harness whose model calls failed because the model proxy was unreachable during RUN — unless it recovered
  (it exited 0 and the proxy served one of its calls after the outage began).

Both end ``infra_error`` and are retried by the rollout server; the second is marked as a dependency outage,
which does not use up the session's attempts.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import dataclasses

from gateway.dependencies import Outage
from gateway.models import AgentRun
from polar_core.records import AgentStatus, CompletionRecord

__all__ = ["AgentFailure", "agent_failure", "stderr_tail"]

_STDERR_TAIL = 800


@dataclasses.dataclass(frozen=True, slots=True)
class AgentFailure:
    """Why a RUN is not scored: the session's error message, and whether a dependency outage caused it."""

    message: str
    dependency_unavailable: bool = False


def stderr_tail(run: AgentRun, limit: int = _STDERR_TAIL) -> str:
    """The last ``limit`` characters of the harness's stderr (its stdout when stderr is empty), stripped."""
    text = (run.stderr or run.stdout).strip()
    return text if len(text) <= limit else "…" + text[-limit:]


def agent_failure(
    run: AgentRun, completions: list[CompletionRecord], proxy_outage: Outage | None
) -> AgentFailure | None:
    """Return why ``run`` must end ``infra_error`` rather than be evaluated, or ``None`` to score it.

    Args:
        run: How the harness ended.
        completions: The session's recorded model calls.
        proxy_outage: The latest proxy outage that overlapped RUN, if the gateway saw one.
    """
    if proxy_outage is not None and not _recovered(run, completions, proxy_outage):
        return AgentFailure(
            f"the model proxy was unreachable while the harness ran (harness {_ending(run)}; "
            f"{len(completions)} model call(s) recorded)" + _detail(run),
            dependency_unavailable=True,
        )
    if run.outcome is AgentStatus.ERROR and not completions:
        return AgentFailure(f"the harness exited with code {run.exit_code} before its first model call" + _detail(run))
    return None


def _recovered(run: AgentRun, completions: list[CompletionRecord], outage: Outage) -> bool:
    """A harness that finished cleanly, and that the proxy served after the outage began, got through it.

    The proxy records only the calls it served; one received after the outage began was answered once the
    proxy was back, so the harness retried what failed. (The outage's recorded end is no guide: the gateway
    sees the proxy again only when its channel reconnects, which may be seconds after the harness does.)
    """
    if run.outcome is not AgentStatus.COMPLETED or not completions:
        return False
    return max(c.started_at for c in completions) >= outage.start


def _ending(run: AgentRun) -> str:
    if run.outcome is AgentStatus.TIMEOUT:
        return "ran past its budget"
    return f"exited with code {run.exit_code}"


def _detail(run: AgentRun) -> str:
    tail = stderr_tail(run)
    return f"; stderr: {tail}" if tail else "; no output"
