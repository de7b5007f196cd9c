import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from polar.common.v1 import reconstruction_pb2 as _reconstruction_pb2
from polar.common.v1 import status_pb2 as _status_pb2
from polar.common.v1 import task_pb2 as _task_pb2
from polar.common.v1 import trace_pb2 as _trace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionSpec(_message.Message):
    __slots__ = ("session_id", "task_id", "sample_index", "task", "deadline", "attempt")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task_id: str
    sample_index: int
    task: _task_pb2.Task
    deadline: _timestamp_pb2.Timestamp
    attempt: int
    def __init__(self, session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class SessionState(_message.Message):
    __slots__ = ("session_id", "task_id", "sample_index", "attempt", "stage", "terminal_status", "gateway_id", "stage_entered_at", "deadline", "error_message")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_ENTERED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task_id: str
    sample_index: int
    attempt: int
    stage: _status_pb2.SessionStage
    terminal_status: _status_pb2.TerminalStatus
    gateway_id: str
    stage_entered_at: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    error_message: str
    def __init__(self, session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., attempt: _Optional[int] = ..., stage: _Optional[_Union[_status_pb2.SessionStage, str]] = ..., terminal_status: _Optional[_Union[_status_pb2.TerminalStatus, str]] = ..., gateway_id: _Optional[str] = ..., stage_entered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error_message: _Optional[str] = ...) -> None: ...

class SessionStatistics(_message.Message):
    __slots__ = ("completions", "prompt_tokens", "response_tokens", "reconstruction")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECONSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    completions: int
    prompt_tokens: int
    response_tokens: int
    reconstruction: _reconstruction_pb2.ReconstructionStats
    def __init__(self, completions: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., response_tokens: _Optional[int] = ..., reconstruction: _Optional[_Union[_reconstruction_pb2.ReconstructionStats, _Mapping]] = ...) -> None: ...

class SessionResult(_message.Message):
    __slots__ = ("session_id", "task_id", "status", "reward", "traces", "timings", "statistics", "error_message", "idempotency_key", "gateway_id", "attempt", "terminal_status", "sample_index", "policy_lag")
    class TimingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task_id: str
    status: str
    reward: float
    traces: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Trace]
    timings: _containers.ScalarMap[str, float]
    statistics: SessionStatistics
    error_message: str
    idempotency_key: str
    gateway_id: str
    attempt: int
    terminal_status: _status_pb2.TerminalStatus
    sample_index: int
    policy_lag: int
    def __init__(self, session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., status: _Optional[str] = ..., reward: _Optional[float] = ..., traces: _Optional[_Iterable[_Union[_trace_pb2.Trace, _Mapping]]] = ..., timings: _Optional[_Mapping[str, float]] = ..., statistics: _Optional[_Union[SessionStatistics, _Mapping]] = ..., error_message: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., gateway_id: _Optional[str] = ..., attempt: _Optional[int] = ..., terminal_status: _Optional[_Union[_status_pb2.TerminalStatus, str]] = ..., sample_index: _Optional[int] = ..., policy_lag: _Optional[int] = ...) -> None: ...
