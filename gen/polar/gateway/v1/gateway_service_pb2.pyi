import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from polar.common.v1 import metrics_pb2 as _metrics_pb2
from polar.common.v1 import session_pb2 as _session_pb2
from polar.common.v1 import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StartSessionRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _session_pb2.SessionSpec
    def __init__(self, spec: _Optional[_Union[_session_pb2.SessionSpec, _Mapping]] = ...) -> None: ...

class StartSessionResponse(_message.Message):
    __slots__ = ("state", "already_started")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ALREADY_STARTED_FIELD_NUMBER: _ClassVar[int]
    state: _session_pb2.SessionState
    already_started: bool
    def __init__(self, state: _Optional[_Union[_session_pb2.SessionState, _Mapping]] = ..., already_started: _Optional[bool] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("state", "result")
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    state: _session_pb2.SessionState
    result: _session_pb2.SessionResult
    def __init__(self, state: _Optional[_Union[_session_pb2.SessionState, _Mapping]] = ..., result: _Optional[_Union[_session_pb2.SessionResult, _Mapping]] = ...) -> None: ...

class CancelSessionRequest(_message.Message):
    __slots__ = ("session_id", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelSessionResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: _session_pb2.SessionState
    def __init__(self, state: _Optional[_Union[_session_pb2.SessionState, _Mapping]] = ...) -> None: ...

class WatchSessionsRequest(_message.Message):
    __slots__ = ("task_id", "session_ids", "include_current")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CURRENT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    include_current: bool
    def __init__(self, task_id: _Optional[str] = ..., session_ids: _Optional[_Iterable[str]] = ..., include_current: _Optional[bool] = ...) -> None: ...

class WatchSessionsResponse(_message.Message):
    __slots__ = ("state", "previous_stage", "event_time", "result")
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STAGE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    state: _session_pb2.SessionState
    previous_stage: _status_pb2.SessionStage
    event_time: _timestamp_pb2.Timestamp
    result: _session_pb2.SessionResult
    def __init__(self, state: _Optional[_Union[_session_pb2.SessionState, _Mapping]] = ..., previous_stage: _Optional[_Union[_status_pb2.SessionStage, str]] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., result: _Optional[_Union[_session_pb2.SessionResult, _Mapping]] = ...) -> None: ...

class GetCapacityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCapacityResponse(_message.Message):
    __slots__ = ("gateway_id", "capacity", "active_sessions", "available", "stage_metrics", "draining")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    STAGE_METRICS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    capacity: int
    active_sessions: int
    available: int
    stage_metrics: _containers.RepeatedCompositeFieldContainer[_metrics_pb2.StageMetrics]
    draining: bool
    def __init__(self, gateway_id: _Optional[str] = ..., capacity: _Optional[int] = ..., active_sessions: _Optional[int] = ..., available: _Optional[int] = ..., stage_metrics: _Optional[_Iterable[_Union[_metrics_pb2.StageMetrics, _Mapping]]] = ..., draining: _Optional[bool] = ...) -> None: ...
