"""What a session's agent did, kept on its result: the patch, the evaluator's per-test outcomes and log reference,
and the tails of the harness's output, each capped (``PipelineConfig.result_*_limit_bytes``).

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

from gateway.models import PipelineConfig, SessionArtifacts
from gateway.session import Session

__all__ = ["cap_patch", "kept_artifacts", "log_tail"]


def cap_patch(patch: bytes | None, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``patch`` and whether it was cut."""
    data = patch or b""
    if len(data) <= limit:
        return data, False
    return data[:limit], True


def log_tail(text: str, limit: int) -> tuple[str, bool]:
    """The last ``limit`` bytes (UTF-8; a split character dropped) of ``text`` and whether it was cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text, False
    return data[len(data) - limit :].decode("utf-8", errors="ignore"), True


def kept_artifacts(s: Session, config: PipelineConfig) -> SessionArtifacts:
    """The :class:`SessionArtifacts` of a session, from what its pipeline collected (empty parts it did not)."""
    collected = s.artifacts.patch if s.artifacts is not None else None
    patch, patch_cut = cap_patch(collected, config.result_patch_limit_bytes)
    run = s.agent_run
    stdout, out_cut = log_tail(run.stdout if run is not None else "", config.result_log_limit_bytes)
    stderr, err_cut = log_tail(run.stderr if run is not None else "", config.result_log_limit_bytes)
    evaluation = s.evaluation
    return SessionArtifacts(
        patch=patch,
        patch_truncated=patch_cut,
        test_outcomes=evaluation.test_outcomes if evaluation is not None else (),
        eval_log_ref=evaluation.log_ref if evaluation is not None else "",
        harness_stdout=stdout,
        harness_stderr=stderr,
        harness_log_truncated=out_cut or err_cut,
    )
