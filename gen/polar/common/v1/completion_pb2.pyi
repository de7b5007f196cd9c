from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Completion(_message.Message):
    __slots__ = ("session_id", "call_id", "parent_call_id", "seq", "protocol", "model", "policy_version", "prompt_token_ids", "response_token_ids", "response_logprobs", "finish_reason", "request", "response", "started_at", "ended_at", "normalization_rules_fired", "tool_call_parse_error", "sampling", "backend", "replica")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATION_RULES_FIRED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_PARSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    call_id: str
    parent_call_id: str
    seq: int
    protocol: str
    model: str
    policy_version: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    request: _struct_pb2.Struct
    response: _struct_pb2.Struct
    started_at: float
    ended_at: float
    normalization_rules_fired: _containers.RepeatedScalarFieldContainer[str]
    tool_call_parse_error: bool
    sampling: _struct_pb2.Struct
    backend: str
    replica: str
    def __init__(self, session_id: _Optional[str] = ..., call_id: _Optional[str] = ..., parent_call_id: _Optional[str] = ..., seq: _Optional[int] = ..., protocol: _Optional[str] = ..., model: _Optional[str] = ..., policy_version: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., response_logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ..., request: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., response: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., normalization_rules_fired: _Optional[_Iterable[str]] = ..., tool_call_parse_error: _Optional[bool] = ..., sampling: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., backend: _Optional[str] = ..., replica: _Optional[str] = ...) -> None: ...
