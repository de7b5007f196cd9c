from google.protobuf import struct_pb2 as _struct_pb2
from polar.common.v1 import reconstruction_pb2 as _reconstruction_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RuntimeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUNTIME_KIND_UNSPECIFIED: _ClassVar[RuntimeKind]
    RUNTIME_KIND_LOCAL: _ClassVar[RuntimeKind]
    RUNTIME_KIND_DOCKER: _ClassVar[RuntimeKind]
    RUNTIME_KIND_APPTAINER: _ClassVar[RuntimeKind]

class StalePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STALE_POLICY_UNSPECIFIED: _ClassVar[StalePolicy]
    STALE_POLICY_KEEP: _ClassVar[StalePolicy]
    STALE_POLICY_RESAMPLE: _ClassVar[StalePolicy]
RUNTIME_KIND_UNSPECIFIED: RuntimeKind
RUNTIME_KIND_LOCAL: RuntimeKind
RUNTIME_KIND_DOCKER: RuntimeKind
RUNTIME_KIND_APPTAINER: RuntimeKind
STALE_POLICY_UNSPECIFIED: StalePolicy
STALE_POLICY_KEEP: StalePolicy
STALE_POLICY_RESAMPLE: StalePolicy

class Task(_message.Message):
    __slots__ = ("task_id", "instruction", "num_samples", "timeout_seconds", "harness", "runtime", "backend", "builder", "evaluator", "metadata", "priority", "early_stop_min_usable_sessions", "callback", "max_policy_lag", "stale_policy")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BUILDER_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOP_MIN_USABLE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_FIELD_NUMBER: _ClassVar[int]
    MAX_POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    STALE_POLICY_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    instruction: str
    num_samples: int
    timeout_seconds: float
    harness: HarnessSpec
    runtime: RuntimeSpec
    backend: BackendSpec
    builder: BuilderSpec
    evaluator: EvaluatorSpec
    metadata: _struct_pb2.Struct
    priority: int
    early_stop_min_usable_sessions: int
    callback: CallbackSpec
    max_policy_lag: int
    stale_policy: StalePolicy
    def __init__(self, task_id: _Optional[str] = ..., instruction: _Optional[str] = ..., num_samples: _Optional[int] = ..., timeout_seconds: _Optional[float] = ..., harness: _Optional[_Union[HarnessSpec, _Mapping]] = ..., runtime: _Optional[_Union[RuntimeSpec, _Mapping]] = ..., backend: _Optional[_Union[BackendSpec, _Mapping]] = ..., builder: _Optional[_Union[BuilderSpec, _Mapping]] = ..., evaluator: _Optional[_Union[EvaluatorSpec, _Mapping]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., priority: _Optional[int] = ..., early_stop_min_usable_sessions: _Optional[int] = ..., callback: _Optional[_Union[CallbackSpec, _Mapping]] = ..., max_policy_lag: _Optional[int] = ..., stale_policy: _Optional[_Union[StalePolicy, str]] = ...) -> None: ...

class HarnessSpec(_message.Message):
    __slots__ = ("name", "options")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    options: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class RuntimeSpec(_message.Message):
    __slots__ = ("kind", "image", "options")
    KIND_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    kind: RuntimeKind
    image: str
    options: _struct_pb2.Struct
    def __init__(self, kind: _Optional[_Union[RuntimeKind, str]] = ..., image: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class BackendSpec(_message.Message):
    __slots__ = ("name", "options")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    options: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class BuilderSpec(_message.Message):
    __slots__ = ("strategy", "end_of_turn_token_ids", "options")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    END_OF_TURN_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    strategy: _reconstruction_pb2.ReconstructionStrategy
    end_of_turn_token_ids: _containers.RepeatedScalarFieldContainer[int]
    options: _struct_pb2.Struct
    def __init__(self, strategy: _Optional[_Union[_reconstruction_pb2.ReconstructionStrategy, str]] = ..., end_of_turn_token_ids: _Optional[_Iterable[int]] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class EvaluatorSpec(_message.Message):
    __slots__ = ("strategy", "options")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    options: _struct_pb2.Struct
    def __init__(self, strategy: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class CallbackSpec(_message.Message):
    __slots__ = ("http_url", "grpc_target", "max_attempts")
    HTTP_URL_FIELD_NUMBER: _ClassVar[int]
    GRPC_TARGET_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    http_url: str
    grpc_target: str
    max_attempts: int
    def __init__(self, http_url: _Optional[str] = ..., grpc_target: _Optional[str] = ..., max_attempts: _Optional[int] = ...) -> None: ...
