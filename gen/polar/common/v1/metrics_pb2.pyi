from polar.common.v1 import status_pb2 as _status_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StageMetrics(_message.Message):
    __slots__ = ("stage", "queue_length", "occupancy", "workers")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    stage: _status_pb2.SessionStage
    queue_length: int
    occupancy: int
    workers: int
    def __init__(self, stage: _Optional[_Union[_status_pb2.SessionStage, str]] = ..., queue_length: _Optional[int] = ..., occupancy: _Optional[int] = ..., workers: _Optional[int] = ...) -> None: ...
