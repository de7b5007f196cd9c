import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from polar.common.v1 import completion_pb2 as _completion_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenSessionRequest(_message.Message):
    __slots__ = ("session_id", "model", "policy_version", "metadata")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    policy_version: str
    metadata: _struct_pb2.Struct
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., policy_version: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_token", "anthropic_base_url", "openai_base_url", "google_base_url")
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ANTHROPIC_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    OPENAI_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    GOOGLE_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    session_token: str
    anthropic_base_url: str
    openai_base_url: str
    google_base_url: str
    def __init__(self, session_token: _Optional[str] = ..., anthropic_base_url: _Optional[str] = ..., openai_base_url: _Optional[str] = ..., google_base_url: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("completions",)
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    completions: int
    def __init__(self, completions: _Optional[int] = ...) -> None: ...

class ListCompletionsRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListCompletionsResponse(_message.Message):
    __slots__ = ("completions", "next_page_token")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[_completion_pb2.Completion]
    next_page_token: str
    def __init__(self, completions: _Optional[_Iterable[_Union[_completion_pb2.Completion, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchCompletionsRequest(_message.Message):
    __slots__ = ("session_id", "from_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    from_seq: int
    def __init__(self, session_id: _Optional[str] = ..., from_seq: _Optional[int] = ...) -> None: ...

class WatchCompletionsResponse(_message.Message):
    __slots__ = ("completion",)
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    completion: _completion_pb2.Completion
    def __init__(self, completion: _Optional[_Union[_completion_pb2.Completion, _Mapping]] = ...) -> None: ...

class SetPolicyVersionRequest(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: str
    def __init__(self, policy_version: _Optional[str] = ...) -> None: ...

class SetPolicyVersionResponse(_message.Message):
    __slots__ = ("previous_policy_version",)
    PREVIOUS_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    previous_policy_version: str
    def __init__(self, previous_policy_version: _Optional[str] = ...) -> None: ...

class PauseGenerationRequest(_message.Message):
    __slots__ = ("abort_in_flight", "drain_timeout")
    ABORT_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    abort_in_flight: bool
    drain_timeout: _duration_pb2.Duration
    def __init__(self, abort_in_flight: _Optional[bool] = ..., drain_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PauseGenerationResponse(_message.Message):
    __slots__ = ("in_flight", "aborted")
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    aborted: int
    def __init__(self, in_flight: _Optional[int] = ..., aborted: _Optional[int] = ...) -> None: ...

class ResumeGenerationRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeGenerationResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class CheckWeightsRequest(_message.Message):
    __slots__ = ("weights_path",)
    WEIGHTS_PATH_FIELD_NUMBER: _ClassVar[int]
    weights_path: str
    def __init__(self, weights_path: _Optional[str] = ...) -> None: ...

class CheckWeightsResponse(_message.Message):
    __slots__ = ("architecture",)
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    architecture: str
    def __init__(self, architecture: _Optional[str] = ...) -> None: ...

class LoadWeightsRequest(_message.Message):
    __slots__ = ("policy_version", "weights_path")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_PATH_FIELD_NUMBER: _ClassVar[int]
    policy_version: str
    weights_path: str
    def __init__(self, policy_version: _Optional[str] = ..., weights_path: _Optional[str] = ...) -> None: ...

class LoadWeightsResponse(_message.Message):
    __slots__ = ("previous_policy_version", "load_seconds")
    PREVIOUS_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    previous_policy_version: str
    load_seconds: float
    def __init__(self, previous_policy_version: _Optional[str] = ..., load_seconds: _Optional[float] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("policy_version", "weights_path", "paused", "in_flight")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_PATH_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    policy_version: str
    weights_path: str
    paused: bool
    in_flight: int
    def __init__(self, policy_version: _Optional[str] = ..., weights_path: _Optional[str] = ..., paused: _Optional[bool] = ..., in_flight: _Optional[int] = ...) -> None: ...
