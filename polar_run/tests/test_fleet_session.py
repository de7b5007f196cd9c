"""``polar generate --server``'s pure parts: the run id kept in ``--out``, tasks as submitted to a fleet, and the
command-line checks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from polar.common.v1 import session_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2

from polar_core.errors import InvalidArgument, NotFound, Unauthenticated
from polar_run.cli import _build_parser
from polar_run.commands import _fleet
from polar_run.dataset import DatasetTask, load_dataset
from polar_run.fleet_session import MANIFEST_FILE, FleetSession, FleetTarget, load_or_create_run_id, prepare_fleet_task
from polar_run.progress import ProgressState
from polar_run.run_config import RunOverrides
from polar_run.run_generate import _prepare_fleet_out

REPO = Path(__file__).resolve().parents[2]


def test_the_run_id_is_created_once_and_read_back(tmp_path: Path) -> None:
    run_id, resumed = load_or_create_run_id(tmp_path / "out", "host:1")
    assert run_id.startswith("gen-")
    assert not resumed
    assert load_or_create_run_id(tmp_path / "out", "host:1") == (run_id, True)
    assert json.loads((tmp_path / "out" / MANIFEST_FILE).read_text())["server"] == "host:1"


def test_a_broken_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_FILE).write_text("{")
    with pytest.raises(InvalidArgument, match="not a polar generate manifest"):
        load_or_create_run_id(tmp_path, "host:1")


def test_an_earlier_fleet_run_is_kept_and_anything_else_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    load_or_create_run_id(out, "host:1")
    (out / "ledger.json").write_text("{}")
    _prepare_fleet_out(out, overwrite=False)  # resumable: kept as it is
    assert (out / "ledger.json").exists()
    _prepare_fleet_out(out, overwrite=True)  # a fresh run
    assert not any(out.iterdir())
    (out / "other").write_text("x")
    with pytest.raises(InvalidArgument, match="not empty"):
        _prepare_fleet_out(out, overwrite=False)


def test_fleet_tasks_are_prefixed_resolved_and_not_checked_against_this_host() -> None:
    tasks = load_dataset(REPO / "examples" / "datasets" / "tiny")
    overrides = RunOverrides(samples=3, timeout_s=60, max_tokens=64, harness_root=None)
    prepared = prepare_fleet_task(tasks[0], overrides, "gen-1234")
    assert prepared.task_id == f"gen-1234.{tasks[0].task_id}"
    assert prepared.task["num_samples"] == 3
    assert prepared.task["timeout_seconds"] == 60
    # pi is not looked for here (the CLIs are the gateways'); --max-tokens still reaches its options.
    assert prepared.harness == "pi"
    assert prepared.harness_bin_dir is None
    assert prepared.task["harness"]["max_tokens"] == 64
    assert Path(prepared.task["evaluator"]["repo"]).is_absolute()


def test_a_fleet_task_without_an_instruction_is_refused(tmp_path: Path) -> None:
    task = DatasetTask({"task_id": "t"}, tmp_path / "task.yaml", "r")
    with pytest.raises(InvalidArgument, match="no instruction"):
        prepare_fleet_task(task, RunOverrides(), "gen-1")


def _args(*argv: str) -> object:
    return _build_parser().parse_args(["generate", "data", "--out", "o", *argv])


def test_server_options_make_a_fleet_target() -> None:
    target = _fleet(_args("--server", "h:1", "--token", "t", "--proxy", "p:2"))  # type: ignore[arg-type]
    assert target == FleetTarget(server="h:1", token="t", proxies=("p:2",))
    assert _fleet(_args()) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--server", "h:1", "--model", "tiny"), "--model configure the embedded stack"),
        (("--server", "h:1", "--backend", "scripted", "--workers", "2"), "--backend, --workers configure"),
        (("--proxy", "p:2"), "--proxy needs --server"),
        (("--server", "h:1", "--tls-ca", "ca.pem"), "mTLS needs"),
    ],
)
def test_embedded_options_are_refused_with_a_server(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _fleet(_args(*argv))  # type: ignore[arg-type]


class _RpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, "")


class _DroppedStream(_RpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, "server went away")


class _FakeClient:
    """A rollout server whose first watch drops after one result, and whose stream never sends ``lost``."""

    def __init__(self, results: list[session_pb2.SessionResult], lost: str = "") -> None:
        self.results_ = results
        self.lost = lost
        self.watches: list[int] = []

    async def watch(
        self, task_id: str, *, from_index: int = 0, reconnect: bool = True
    ) -> AsyncIterator[session_pb2.SessionResult]:
        self.watches.append(from_index)
        sent = [r for r in self.results_ if r.session_id != self.lost]
        for i, result in enumerate(sent[from_index:], start=from_index):
            if len(self.watches) == 1 and i == 1:
                raise _DroppedStream()
            yield result

    async def get(self, task_id: str, *, summary_only: bool = False) -> rollout_service_pb2.GetTaskResponse:
        info = rollout_service_pb2.TaskInfo(sessions_done=len(self.results_))
        return rollout_service_pb2.GetTaskResponse(task=info)

    async def results(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]:
        for result in self.results_:
            yield result

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("lost", ["", "t-0001"])
async def test_results_resume_after_a_dropped_stream_and_are_reconciled(lost: str) -> None:
    results = [session_pb2.SessionResult(session_id=f"t-{i:04d}", status="resolved") for i in range(3)]
    session = FleetSession(FleetTarget(server="127.0.0.1:1"), ProgressState(3), lambda: None)
    fake = _FakeClient(results, lost)
    await session.client.close()
    session.client = fake  # type: ignore[assignment]
    seen = [r.session_id async for r in session.results("t")]
    assert sorted(seen) == ["t-0000", "t-0001", "t-0002"]
    assert len(seen) == len(set(seen))
    assert fake.watches == [0, 1]  # resumed at the next result index


class _Answers:
    """A rollout server whose SubmitTask and GetPolicy fail with the given codes, in turn, then answer."""

    def __init__(self, *codes: grpc.StatusCode) -> None:
        self.codes = list(codes)
        self.calls = 0

    def _next(self) -> None:
        self.calls += 1
        if self.codes:
            raise _RpcError(self.codes.pop(0), "no")

    async def submit(self, task: task_pb2.Task) -> rollout_service_pb2.SubmitTaskResponse:
        self._next()
        return rollout_service_pb2.SubmitTaskResponse(task_id=task.task_id)

    async def get_policy(self) -> rollout_service_pb2.GetPolicyResponse:
        self._next()
        return rollout_service_pb2.GetPolicyResponse()

    async def close(self) -> None:
        return None


async def _session(answers: _Answers) -> FleetSession:
    session = FleetSession(FleetTarget(server="127.0.0.1:1", proxies=("p:1",)), ProgressState(1), lambda: None)
    await session.client.close()
    session.client = answers  # type: ignore[assignment]
    return session


async def test_failed_calls_go_through_the_client_error_mapper(monkeypatch: pytest.MonkeyPatch) -> None:
    import polar_run.fleet_session as fleet_session

    monkeypatch.setattr(fleet_session, "_BACKOFF_S", (0.0,))
    task = task_pb2.Task(task_id="run.t")
    unreachable_once = _Answers(grpc.StatusCode.UNAVAILABLE)
    assert await (await _session(unreachable_once)).submit(task) == "run.t"
    assert unreachable_once.calls == 2  # retried while unreachable
    with pytest.raises(InvalidArgument, match="is on the server with other content"):
        await (await _session(_Answers(grpc.StatusCode.ALREADY_EXISTS))).submit(task)
    with pytest.raises(InvalidArgument, match=r"rejected task run\.t: no$"):
        await (await _session(_Answers(grpc.StatusCode.INVALID_ARGUMENT))).submit(task)
    with pytest.raises(NotFound, match=r"SubmitTask run\.t: no"):
        await (await _session(_Answers(grpc.StatusCode.NOT_FOUND))).submit(task)
    with pytest.raises(Unauthenticated, match=r"refused the token \(PERMISSION_DENIED\)"):
        await (await _session(_Answers(grpc.StatusCode.PERMISSION_DENIED)))._connect()
    with pytest.raises(InvalidArgument, match=r"answered INTERNAL: no$"):
        await (await _session(_Answers(grpc.StatusCode.INTERNAL)))._connect()
