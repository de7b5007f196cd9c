from polar.common.v1 import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Trace(_message.Message):
    __slots__ = ("session_id", "task_id", "trace_index", "call_ids", "prompt_token_ids", "response_token_ids", "loss_mask", "response_logprobs", "reward", "weight", "status", "exact_context", "policy_versions", "terminal_status", "policy_lag")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_INDEX_FIELD_NUMBER: _ClassVar[int]
    CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXACT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task_id: str
    trace_index: int
    call_ids: _containers.RepeatedScalarFieldContainer[str]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    response_logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    weight: float
    status: str
    exact_context: bool
    policy_versions: _containers.RepeatedScalarFieldContainer[str]
    terminal_status: _status_pb2.TerminalStatus
    policy_lag: int
    def __init__(self, session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., trace_index: _Optional[int] = ..., call_ids: _Optional[_Iterable[str]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., response_logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[float] = ..., weight: _Optional[float] = ..., status: _Optional[str] = ..., exact_context: _Optional[bool] = ..., policy_versions: _Optional[_Iterable[str]] = ..., terminal_status: _Optional[_Union[_status_pb2.TerminalStatus, str]] = ..., policy_lag: _Optional[int] = ...) -> None: ...
