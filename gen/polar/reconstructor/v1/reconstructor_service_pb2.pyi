from polar.common.v1 import completion_pb2 as _completion_pb2
from polar.common.v1 import reconstruction_pb2 as _reconstruction_pb2
from polar.common.v1 import status_pb2 as _status_pb2
from polar.common.v1 import trace_pb2 as _trace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WeightingMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHTING_MODE_UNSPECIFIED: _ClassVar[WeightingMode]
    WEIGHTING_MODE_SESSION: _ClassVar[WeightingMode]
    WEIGHTING_MODE_TRACE: _ClassVar[WeightingMode]
WEIGHTING_MODE_UNSPECIFIED: WeightingMode
WEIGHTING_MODE_SESSION: WeightingMode
WEIGHTING_MODE_TRACE: WeightingMode

class CompletionList(_message.Message):
    __slots__ = ("completions",)
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[_completion_pb2.Completion]
    def __init__(self, completions: _Optional[_Iterable[_Union[_completion_pb2.Completion, _Mapping]]] = ...) -> None: ...

class ProxySource(_message.Message):
    __slots__ = ("proxy_target", "session_id")
    PROXY_TARGET_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    proxy_target: str
    session_id: str
    def __init__(self, proxy_target: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class ReconstructRequest(_message.Message):
    __slots__ = ("completions", "proxy", "strategy", "end_of_turn_token_ids", "task_id", "reward", "terminal_status", "weighting")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    PROXY_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    END_OF_TURN_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTING_FIELD_NUMBER: _ClassVar[int]
    completions: CompletionList
    proxy: ProxySource
    strategy: _reconstruction_pb2.ReconstructionStrategy
    end_of_turn_token_ids: _containers.RepeatedScalarFieldContainer[int]
    task_id: str
    reward: float
    terminal_status: _status_pb2.TerminalStatus
    weighting: WeightingMode
    def __init__(self, completions: _Optional[_Union[CompletionList, _Mapping]] = ..., proxy: _Optional[_Union[ProxySource, _Mapping]] = ..., strategy: _Optional[_Union[_reconstruction_pb2.ReconstructionStrategy, str]] = ..., end_of_turn_token_ids: _Optional[_Iterable[int]] = ..., task_id: _Optional[str] = ..., reward: _Optional[float] = ..., terminal_status: _Optional[_Union[_status_pb2.TerminalStatus, str]] = ..., weighting: _Optional[_Union[WeightingMode, str]] = ...) -> None: ...

class ReconstructResponse(_message.Message):
    __slots__ = ("traces", "stats")
    TRACES_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    traces: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Trace]
    stats: _reconstruction_pb2.ReconstructionStats
    def __init__(self, traces: _Optional[_Iterable[_Union[_trace_pb2.Trace, _Mapping]]] = ..., stats: _Optional[_Union[_reconstruction_pb2.ReconstructionStats, _Mapping]] = ...) -> None: ...

class ReconstructStreamRequest(_message.Message):
    __slots__ = ("request", "completions")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    request: ReconstructRequest
    completions: CompletionList
    def __init__(self, request: _Optional[_Union[ReconstructRequest, _Mapping]] = ..., completions: _Optional[_Union[CompletionList, _Mapping]] = ...) -> None: ...

class ReconstructStreamResponse(_message.Message):
    __slots__ = ("traces", "stats")
    TRACES_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    traces: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Trace]
    stats: _reconstruction_pb2.ReconstructionStats
    def __init__(self, traces: _Optional[_Iterable[_Union[_trace_pb2.Trace, _Mapping]]] = ..., stats: _Optional[_Union[_reconstruction_pb2.ReconstructionStats, _Mapping]] = ...) -> None: ...
