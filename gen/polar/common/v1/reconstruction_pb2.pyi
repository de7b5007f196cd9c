from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ReconstructionStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECONSTRUCTION_STRATEGY_UNSPECIFIED: _ClassVar[ReconstructionStrategy]
    RECONSTRUCTION_STRATEGY_PER_REQUEST: _ClassVar[ReconstructionStrategy]
    RECONSTRUCTION_STRATEGY_PREFIX_MERGE: _ClassVar[ReconstructionStrategy]
    RECONSTRUCTION_STRATEGY_EXACT: _ClassVar[ReconstructionStrategy]
RECONSTRUCTION_STRATEGY_UNSPECIFIED: ReconstructionStrategy
RECONSTRUCTION_STRATEGY_PER_REQUEST: ReconstructionStrategy
RECONSTRUCTION_STRATEGY_PREFIX_MERGE: ReconstructionStrategy
RECONSTRUCTION_STRATEGY_EXACT: ReconstructionStrategy

class ReconstructionStats(_message.Message):
    __slots__ = ("calls", "chains", "merges", "splits_by_reason", "mismatched_context_calls", "mismatched_context_tokens", "trainable_tokens", "total_tokens", "aborted_calls")
    class SplitsByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    MERGES_FIELD_NUMBER: _ClassVar[int]
    SPLITS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    MISMATCHED_CONTEXT_CALLS_FIELD_NUMBER: _ClassVar[int]
    MISMATCHED_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: int
    chains: int
    merges: int
    splits_by_reason: _containers.ScalarMap[str, int]
    mismatched_context_calls: int
    mismatched_context_tokens: int
    trainable_tokens: int
    total_tokens: int
    aborted_calls: int
    def __init__(self, calls: _Optional[int] = ..., chains: _Optional[int] = ..., merges: _Optional[int] = ..., splits_by_reason: _Optional[_Mapping[str, int]] = ..., mismatched_context_calls: _Optional[int] = ..., mismatched_context_tokens: _Optional[int] = ..., trainable_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., aborted_calls: _Optional[int] = ...) -> None: ...
