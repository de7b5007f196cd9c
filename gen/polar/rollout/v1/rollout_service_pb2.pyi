import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from polar.common.v1 import metrics_pb2 as _metrics_pb2
from polar.common.v1 import session_pb2 as _session_pb2
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

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_DRAIN: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]

class ProxyUpdateState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROXY_UPDATE_STATE_UNSPECIFIED: _ClassVar[ProxyUpdateState]
    PROXY_UPDATE_STATE_UPDATED: _ClassVar[ProxyUpdateState]
    PROXY_UPDATE_STATE_FAILED: _ClassVar[ProxyUpdateState]
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_DRAIN: PauseMode
PAUSE_MODE_ABORT: PauseMode
PROXY_UPDATE_STATE_UNSPECIFIED: ProxyUpdateState
PROXY_UPDATE_STATE_UPDATED: ProxyUpdateState
PROXY_UPDATE_STATE_FAILED: ProxyUpdateState

class PolicyInfo(_message.Message):
    __slots__ = ("version", "weights_path", "updated_at")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_PATH_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    version: int
    weights_path: str
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, version: _Optional[int] = ..., weights_path: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ProxyUpdate(_message.Message):
    __slots__ = ("proxy_id", "address", "state", "error", "load_seconds", "aborted_calls")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_CALLS_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    address: str
    state: ProxyUpdateState
    error: str
    load_seconds: float
    aborted_calls: int
    def __init__(self, proxy_id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[ProxyUpdateState, str]] = ..., error: _Optional[str] = ..., load_seconds: _Optional[float] = ..., aborted_calls: _Optional[int] = ...) -> None: ...

class UpdatePolicyRequest(_message.Message):
    __slots__ = ("version", "weights_path", "pause_mode", "drain_timeout", "weights_synced")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_PATH_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MODE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_SYNCED_FIELD_NUMBER: _ClassVar[int]
    version: int
    weights_path: str
    pause_mode: PauseMode
    drain_timeout: _duration_pb2.Duration
    weights_synced: bool
    def __init__(self, version: _Optional[int] = ..., weights_path: _Optional[str] = ..., pause_mode: _Optional[_Union[PauseMode, str]] = ..., drain_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., weights_synced: _Optional[bool] = ...) -> None: ...

class UpdatePolicyResponse(_message.Message):
    __slots__ = ("policy", "proxies", "complete", "replayed", "seconds")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    policy: PolicyInfo
    proxies: _containers.RepeatedCompositeFieldContainer[ProxyUpdate]
    complete: bool
    replayed: bool
    seconds: float
    def __init__(self, policy: _Optional[_Union[PolicyInfo, _Mapping]] = ..., proxies: _Optional[_Iterable[_Union[ProxyUpdate, _Mapping]]] = ..., complete: _Optional[bool] = ..., replayed: _Optional[bool] = ..., seconds: _Optional[float] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProxyInfo(_message.Message):
    __slots__ = ("proxy_id", "address", "version", "paused", "error", "registered_at")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    address: str
    version: int
    paused: bool
    error: str
    registered_at: _timestamp_pb2.Timestamp
    def __init__(self, proxy_id: _Optional[str] = ..., address: _Optional[str] = ..., version: _Optional[int] = ..., paused: _Optional[bool] = ..., error: _Optional[str] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("policy", "proxies")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    policy: PolicyInfo
    proxies: _containers.RepeatedCompositeFieldContainer[ProxyInfo]
    def __init__(self, policy: _Optional[_Union[PolicyInfo, _Mapping]] = ..., proxies: _Optional[_Iterable[_Union[ProxyInfo, _Mapping]]] = ...) -> None: ...

class RegisterProxyRequest(_message.Message):
    __slots__ = ("proxy_id", "address", "backend", "version")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    address: str
    backend: str
    version: str
    def __init__(self, proxy_id: _Optional[str] = ..., address: _Optional[str] = ..., backend: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class RegisterProxyResponse(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: PolicyInfo
    def __init__(self, policy: _Optional[_Union[PolicyInfo, _Mapping]] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("task", "status", "sessions_total", "sessions_done", "sessions_usable", "sessions_running", "sessions_by_status", "mean_reward", "submitted_at", "finished_at", "error_message", "statistics", "deadline")
    class SessionsByStatusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_DONE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_USABLE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_BY_STATUS_FIELD_NUMBER: _ClassVar[int]
    MEAN_REWARD_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    task: _task_pb2.Task
    status: _status_pb2.TaskStatus
    sessions_total: int
    sessions_done: int
    sessions_usable: int
    sessions_running: int
    sessions_by_status: _containers.ScalarMap[str, int]
    mean_reward: float
    submitted_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    error_message: str
    statistics: TaskStatistics
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., status: _Optional[_Union[_status_pb2.TaskStatus, str]] = ..., sessions_total: _Optional[int] = ..., sessions_done: _Optional[int] = ..., sessions_usable: _Optional[int] = ..., sessions_running: _Optional[int] = ..., sessions_by_status: _Optional[_Mapping[str, int]] = ..., mean_reward: _Optional[float] = ..., submitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error_message: _Optional[str] = ..., statistics: _Optional[_Union[TaskStatistics, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Distribution(_message.Message):
    __slots__ = ("count", "mean", "p50", "p90", "max")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    P50_FIELD_NUMBER: _ClassVar[int]
    P90_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    count: int
    mean: float
    p50: float
    p90: float
    max: float
    def __init__(self, count: _Optional[int] = ..., mean: _Optional[float] = ..., p50: _Optional[float] = ..., p90: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class PolicyAgeBucket(_message.Message):
    __slots__ = ("policy_age", "sessions", "mean_reward")
    POLICY_AGE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MEAN_REWARD_FIELD_NUMBER: _ClassVar[int]
    policy_age: int
    sessions: int
    mean_reward: float
    def __init__(self, policy_age: _Optional[int] = ..., sessions: _Optional[int] = ..., mean_reward: _Optional[float] = ...) -> None: ...

class TaskStatistics(_message.Message):
    __slots__ = ("session_duration_seconds", "calls", "chains", "policy_age", "reward_by_policy_age", "sessions_dropped", "sessions_retried", "sessions_truncated", "attempts_total", "deliveries_pending", "deliveries_dead_lettered", "deliveries_delivered", "policy_lag", "sessions_stale_resampled", "sessions_stale_kept")
    SESSION_DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    POLICY_AGE_FIELD_NUMBER: _ClassVar[int]
    REWARD_BY_POLICY_AGE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_RETRIED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_PENDING_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_DELIVERED_FIELD_NUMBER: _ClassVar[int]
    POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_STALE_RESAMPLED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_STALE_KEPT_FIELD_NUMBER: _ClassVar[int]
    session_duration_seconds: Distribution
    calls: Distribution
    chains: Distribution
    policy_age: Distribution
    reward_by_policy_age: _containers.RepeatedCompositeFieldContainer[PolicyAgeBucket]
    sessions_dropped: int
    sessions_retried: int
    sessions_truncated: int
    attempts_total: int
    deliveries_pending: int
    deliveries_dead_lettered: int
    deliveries_delivered: int
    policy_lag: Distribution
    sessions_stale_resampled: int
    sessions_stale_kept: int
    def __init__(self, session_duration_seconds: _Optional[_Union[Distribution, _Mapping]] = ..., calls: _Optional[_Union[Distribution, _Mapping]] = ..., chains: _Optional[_Union[Distribution, _Mapping]] = ..., policy_age: _Optional[_Union[Distribution, _Mapping]] = ..., reward_by_policy_age: _Optional[_Iterable[_Union[PolicyAgeBucket, _Mapping]]] = ..., sessions_dropped: _Optional[int] = ..., sessions_retried: _Optional[int] = ..., sessions_truncated: _Optional[int] = ..., attempts_total: _Optional[int] = ..., deliveries_pending: _Optional[int] = ..., deliveries_dead_lettered: _Optional[int] = ..., deliveries_delivered: _Optional[int] = ..., policy_lag: _Optional[_Union[Distribution, _Mapping]] = ..., sessions_stale_resampled: _Optional[int] = ..., sessions_stale_kept: _Optional[int] = ...) -> None: ...

class SubmitTaskRequest(_message.Message):
    __slots__ = ("task", "task_timeout")
    TASK_FIELD_NUMBER: _ClassVar[int]
    TASK_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    task: _task_pb2.Task
    task_timeout: _duration_pb2.Duration
    def __init__(self, task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., task_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SubmitTaskResponse(_message.Message):
    __slots__ = ("task_id", "task", "already_existed")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ALREADY_EXISTED_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    task: TaskInfo
    already_existed: bool
    def __init__(self, task_id: _Optional[str] = ..., task: _Optional[_Union[TaskInfo, _Mapping]] = ..., already_existed: _Optional[bool] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id", "summary_only", "omit_traces", "from_result_index", "max_results", "max_page_bytes", "from_trace_index", "max_result_bytes")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_ONLY_FIELD_NUMBER: _ClassVar[int]
    OMIT_TRACES_FIELD_NUMBER: _ClassVar[int]
    FROM_RESULT_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    MAX_PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FROM_TRACE_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULT_BYTES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    summary_only: bool
    omit_traces: bool
    from_result_index: int
    max_results: int
    max_page_bytes: int
    from_trace_index: int
    max_result_bytes: int
    def __init__(self, task_id: _Optional[str] = ..., summary_only: _Optional[bool] = ..., omit_traces: _Optional[bool] = ..., from_result_index: _Optional[int] = ..., max_results: _Optional[int] = ..., max_page_bytes: _Optional[int] = ..., from_trace_index: _Optional[int] = ..., max_result_bytes: _Optional[int] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task", "session_results", "next_result_index", "next_trace_index")
    TASK_FIELD_NUMBER: _ClassVar[int]
    SESSION_RESULTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_RESULT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NEXT_TRACE_INDEX_FIELD_NUMBER: _ClassVar[int]
    task: TaskInfo
    session_results: _containers.RepeatedCompositeFieldContainer[_session_pb2.SessionResult]
    next_result_index: int
    next_trace_index: int
    def __init__(self, task: _Optional[_Union[TaskInfo, _Mapping]] = ..., session_results: _Optional[_Iterable[_Union[_session_pb2.SessionResult, _Mapping]]] = ..., next_result_index: _Optional[int] = ..., next_trace_index: _Optional[int] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "status_filter")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATUS_FILTER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    status_filter: _status_pb2.TaskStatus
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., status_filter: _Optional[_Union[_status_pb2.TaskStatus, str]] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchTaskRequest(_message.Message):
    __slots__ = ("task_id", "from_result_index", "omit_traces", "max_result_bytes")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_RESULT_INDEX_FIELD_NUMBER: _ClassVar[int]
    OMIT_TRACES_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULT_BYTES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    from_result_index: int
    omit_traces: bool
    max_result_bytes: int
    def __init__(self, task_id: _Optional[str] = ..., from_result_index: _Optional[int] = ..., omit_traces: _Optional[bool] = ..., max_result_bytes: _Optional[int] = ...) -> None: ...

class WatchTaskResponse(_message.Message):
    __slots__ = ("session_result", "result_index", "task", "result_continues", "first_trace_index")
    SESSION_RESULT_FIELD_NUMBER: _ClassVar[int]
    RESULT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    RESULT_CONTINUES_FIELD_NUMBER: _ClassVar[int]
    FIRST_TRACE_INDEX_FIELD_NUMBER: _ClassVar[int]
    session_result: _session_pb2.SessionResult
    result_index: int
    task: TaskInfo
    result_continues: bool
    first_trace_index: int
    def __init__(self, session_result: _Optional[_Union[_session_pb2.SessionResult, _Mapping]] = ..., result_index: _Optional[int] = ..., task: _Optional[_Union[TaskInfo, _Mapping]] = ..., result_continues: _Optional[bool] = ..., first_trace_index: _Optional[int] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskInfo
    def __init__(self, task: _Optional[_Union[TaskInfo, _Mapping]] = ...) -> None: ...

class RegisterGatewayRequest(_message.Message):
    __slots__ = ("gateway_id", "address", "capacity", "labels", "version")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    address: str
    capacity: int
    labels: _containers.ScalarMap[str, str]
    version: str
    def __init__(self, gateway_id: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., version: _Optional[str] = ...) -> None: ...

class RegisterGatewayResponse(_message.Message):
    __slots__ = ("gateway_id", "heartbeat_interval", "lease_ttl")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    heartbeat_interval: _duration_pb2.Duration
    lease_ttl: _duration_pb2.Duration
    def __init__(self, gateway_id: _Optional[str] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("gateway_id", "capacity", "active_sessions", "stage_metrics", "draining")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    STAGE_METRICS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    capacity: int
    active_sessions: int
    stage_metrics: _containers.RepeatedCompositeFieldContainer[_metrics_pb2.StageMetrics]
    draining: bool
    def __init__(self, gateway_id: _Optional[str] = ..., capacity: _Optional[int] = ..., active_sessions: _Optional[int] = ..., stage_metrics: _Optional[_Iterable[_Union[_metrics_pb2.StageMetrics, _Mapping]]] = ..., draining: _Optional[bool] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("drain_requested", "cancelled_session_ids")
    DRAIN_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    drain_requested: bool
    cancelled_session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, drain_requested: _Optional[bool] = ..., cancelled_session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainGatewayRequest(_message.Message):
    __slots__ = ("gateway_id", "reason")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    reason: str
    def __init__(self, gateway_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DrainGatewayResponse(_message.Message):
    __slots__ = ("active_sessions",)
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    active_sessions: int
    def __init__(self, active_sessions: _Optional[int] = ...) -> None: ...

class ListGatewaysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GatewayInfo(_message.Message):
    __slots__ = ("gateway_id", "address", "capacity", "active_sessions", "draining", "live", "lease_expires_at", "version", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    address: str
    capacity: int
    active_sessions: int
    draining: bool
    live: bool
    lease_expires_at: _timestamp_pb2.Timestamp
    version: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, gateway_id: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[int] = ..., active_sessions: _Optional[int] = ..., draining: _Optional[bool] = ..., live: _Optional[bool] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListGatewaysResponse(_message.Message):
    __slots__ = ("gateways",)
    GATEWAYS_FIELD_NUMBER: _ClassVar[int]
    gateways: _containers.RepeatedCompositeFieldContainer[GatewayInfo]
    def __init__(self, gateways: _Optional[_Iterable[_Union[GatewayInfo, _Mapping]]] = ...) -> None: ...

class ReportSessionResultRequest(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: _session_pb2.SessionResult
    def __init__(self, result: _Optional[_Union[_session_pb2.SessionResult, _Mapping]] = ...) -> None: ...

class ReportSessionResultStreamRequest(_message.Message):
    __slots__ = ("result", "traces")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    result: _session_pb2.SessionResult
    traces: TraceChunk
    def __init__(self, result: _Optional[_Union[_session_pb2.SessionResult, _Mapping]] = ..., traces: _Optional[_Union[TraceChunk, _Mapping]] = ...) -> None: ...

class TraceChunk(_message.Message):
    __slots__ = ("traces",)
    TRACES_FIELD_NUMBER: _ClassVar[int]
    traces: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Trace]
    def __init__(self, traces: _Optional[_Iterable[_Union[_trace_pb2.Trace, _Mapping]]] = ...) -> None: ...

class ReportSessionResultResponse(_message.Message):
    __slots__ = ("duplicate",)
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    def __init__(self, duplicate: _Optional[bool] = ...) -> None: ...

class ReportSessionResultStreamResponse(_message.Message):
    __slots__ = ("duplicate",)
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    def __init__(self, duplicate: _Optional[bool] = ...) -> None: ...
