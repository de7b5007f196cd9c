import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from polar.common.v1 import status_pb2 as _status_pb2
from polar.common.v1 import task_pb2 as _task_pb2
from polar.common.v1 import trace_pb2 as _trace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGENT_STATUS_UNSPECIFIED: _ClassVar[AgentStatus]
    AGENT_STATUS_COMPLETED: _ClassVar[AgentStatus]
    AGENT_STATUS_TIMEOUT: _ClassVar[AgentStatus]
    AGENT_STATUS_ERROR: _ClassVar[AgentStatus]
    AGENT_STATUS_CANCELLED: _ClassVar[AgentStatus]

class TestOutcomeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TEST_OUTCOME_STATUS_UNSPECIFIED: _ClassVar[TestOutcomeStatus]
    TEST_OUTCOME_STATUS_PASSED: _ClassVar[TestOutcomeStatus]
    TEST_OUTCOME_STATUS_FAILED: _ClassVar[TestOutcomeStatus]
    TEST_OUTCOME_STATUS_ERROR: _ClassVar[TestOutcomeStatus]
    TEST_OUTCOME_STATUS_SKIPPED: _ClassVar[TestOutcomeStatus]
    TEST_OUTCOME_STATUS_MISSING: _ClassVar[TestOutcomeStatus]
AGENT_STATUS_UNSPECIFIED: AgentStatus
AGENT_STATUS_COMPLETED: AgentStatus
AGENT_STATUS_TIMEOUT: AgentStatus
AGENT_STATUS_ERROR: AgentStatus
AGENT_STATUS_CANCELLED: AgentStatus
TEST_OUTCOME_STATUS_UNSPECIFIED: TestOutcomeStatus
TEST_OUTCOME_STATUS_PASSED: TestOutcomeStatus
TEST_OUTCOME_STATUS_FAILED: TestOutcomeStatus
TEST_OUTCOME_STATUS_ERROR: TestOutcomeStatus
TEST_OUTCOME_STATUS_SKIPPED: TestOutcomeStatus
TEST_OUTCOME_STATUS_MISSING: TestOutcomeStatus

class PrepareRequest(_message.Message):
    __slots__ = ("evaluator", "task_id", "session_id", "repository_snapshot", "image", "metadata", "request_id")
    EVALUATOR_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REPOSITORY_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    evaluator: _task_pb2.EvaluatorSpec
    task_id: str
    session_id: str
    repository_snapshot: str
    image: str
    metadata: _struct_pb2.Struct
    request_id: str
    def __init__(self, evaluator: _Optional[_Union[_task_pb2.EvaluatorSpec, _Mapping]] = ..., task_id: _Optional[str] = ..., session_id: _Optional[str] = ..., repository_snapshot: _Optional[str] = ..., image: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class PrepareResponse(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: str
    def __init__(self, handle: _Optional[str] = ...) -> None: ...

class ArtifactFile(_message.Message):
    __slots__ = ("path", "content")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: bytes
    def __init__(self, path: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class EvaluationArtifacts(_message.Message):
    __slots__ = ("patch_bytes", "patch_text", "files", "agent_status", "traces")
    PATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    PATCH_TEXT_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    AGENT_STATUS_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    patch_bytes: bytes
    patch_text: str
    files: _containers.RepeatedCompositeFieldContainer[ArtifactFile]
    agent_status: AgentStatus
    traces: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Trace]
    def __init__(self, patch_bytes: _Optional[bytes] = ..., patch_text: _Optional[str] = ..., files: _Optional[_Iterable[_Union[ArtifactFile, _Mapping]]] = ..., agent_status: _Optional[_Union[AgentStatus, str]] = ..., traces: _Optional[_Iterable[_Union[_trace_pb2.Trace, _Mapping]]] = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("handle", "artifacts", "timeout")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    handle: str
    artifacts: EvaluationArtifacts
    timeout: _duration_pb2.Duration
    def __init__(self, handle: _Optional[str] = ..., artifacts: _Optional[_Union[EvaluationArtifacts, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class TestOutcome(_message.Message):
    __slots__ = ("test_id", "outcome", "duration")
    TEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    test_id: str
    outcome: TestOutcomeStatus
    duration: _duration_pb2.Duration
    def __init__(self, test_id: _Optional[str] = ..., outcome: _Optional[_Union[TestOutcomeStatus, str]] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("reward", "terminal_status", "test_outcomes", "trace_rewards", "log_ref", "error_message", "duration")
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    TEST_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    TRACE_REWARDS_FIELD_NUMBER: _ClassVar[int]
    LOG_REF_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    reward: float
    terminal_status: _status_pb2.TerminalStatus
    test_outcomes: _containers.RepeatedCompositeFieldContainer[TestOutcome]
    trace_rewards: _containers.RepeatedScalarFieldContainer[float]
    log_ref: str
    error_message: str
    duration: _duration_pb2.Duration
    def __init__(self, reward: _Optional[float] = ..., terminal_status: _Optional[_Union[_status_pb2.TerminalStatus, str]] = ..., test_outcomes: _Optional[_Iterable[_Union[TestOutcome, _Mapping]]] = ..., trace_rewards: _Optional[_Iterable[float]] = ..., log_ref: _Optional[str] = ..., error_message: _Optional[str] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: str
    def __init__(self, handle: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...
