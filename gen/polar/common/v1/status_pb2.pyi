from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class TerminalStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TERMINAL_STATUS_UNSPECIFIED: _ClassVar[TerminalStatus]
    TERMINAL_STATUS_RESOLVED: _ClassVar[TerminalStatus]
    TERMINAL_STATUS_UNRESOLVED: _ClassVar[TerminalStatus]
    TERMINAL_STATUS_AGENT_TIMEOUT: _ClassVar[TerminalStatus]
    TERMINAL_STATUS_EVAL_TIMEOUT: _ClassVar[TerminalStatus]
    TERMINAL_STATUS_INVALID_PATCH: _ClassVar[TerminalStatus]
    TERMINAL_STATUS_INFRA_ERROR: _ClassVar[TerminalStatus]
    TERMINAL_STATUS_CANCELLED: _ClassVar[TerminalStatus]

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_PENDING: _ClassVar[TaskStatus]
    TASK_STATUS_RUNNING: _ClassVar[TaskStatus]
    TASK_STATUS_COMPLETED: _ClassVar[TaskStatus]
    TASK_STATUS_CANCELLED: _ClassVar[TaskStatus]
    TASK_STATUS_FAILED: _ClassVar[TaskStatus]

class SessionStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STAGE_UNSPECIFIED: _ClassVar[SessionStage]
    SESSION_STAGE_INIT: _ClassVar[SessionStage]
    SESSION_STAGE_READY: _ClassVar[SessionStage]
    SESSION_STAGE_RUNNING: _ClassVar[SessionStage]
    SESSION_STAGE_POSTRUN: _ClassVar[SessionStage]
    SESSION_STAGE_DONE: _ClassVar[SessionStage]
TERMINAL_STATUS_UNSPECIFIED: TerminalStatus
TERMINAL_STATUS_RESOLVED: TerminalStatus
TERMINAL_STATUS_UNRESOLVED: TerminalStatus
TERMINAL_STATUS_AGENT_TIMEOUT: TerminalStatus
TERMINAL_STATUS_EVAL_TIMEOUT: TerminalStatus
TERMINAL_STATUS_INVALID_PATCH: TerminalStatus
TERMINAL_STATUS_INFRA_ERROR: TerminalStatus
TERMINAL_STATUS_CANCELLED: TerminalStatus
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_PENDING: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_COMPLETED: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
TASK_STATUS_FAILED: TaskStatus
SESSION_STAGE_UNSPECIFIED: SessionStage
SESSION_STAGE_INIT: SessionStage
SESSION_STAGE_READY: SessionStage
SESSION_STAGE_RUNNING: SessionStage
SESSION_STAGE_POSTRUN: SessionStage
SESSION_STAGE_DONE: SessionStage
