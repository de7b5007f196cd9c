from polar.common.v1 import session_pb2 as _session_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliverSessionResultRequest(_message.Message):
    __slots__ = ("idempotency_key", "session_result", "delivery_attempt")
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_RESULT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    session_result: _session_pb2.SessionResult
    delivery_attempt: int
    def __init__(self, idempotency_key: _Optional[str] = ..., session_result: _Optional[_Union[_session_pb2.SessionResult, _Mapping]] = ..., delivery_attempt: _Optional[int] = ...) -> None: ...

class DeliverSessionResultResponse(_message.Message):
    __slots__ = ("duplicate",)
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    def __init__(self, duplicate: _Optional[bool] = ...) -> None: ...
