import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainingPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINING_PHASE_UNSPECIFIED: _ClassVar[TrainingPhase]
    TRAINING_PHASE_PERSONA_ALIGNMENT: _ClassVar[TrainingPhase]
    TRAINING_PHASE_COLLABORATIVE: _ClassVar[TrainingPhase]

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_PENDING: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_SUCCEEDED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_CANCELLED: _ClassVar[RunState]
TRAINING_PHASE_UNSPECIFIED: TrainingPhase
TRAINING_PHASE_PERSONA_ALIGNMENT: TrainingPhase
TRAINING_PHASE_COLLABORATIVE: TrainingPhase
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_PENDING: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_SUCCEEDED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_CANCELLED: RunState

class TrainingRun(_message.Message):
    __slots__ = ("run_id", "phase", "state", "job_name", "namespace", "create_time", "start_time", "finish_time", "message", "active_pods", "failed_pods")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PODS_FIELD_NUMBER: _ClassVar[int]
    FAILED_PODS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    phase: TrainingPhase
    state: RunState
    job_name: str
    namespace: str
    create_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    message: str
    active_pods: int
    failed_pods: int
    def __init__(self, run_id: _Optional[str] = ..., phase: _Optional[_Union[TrainingPhase, str]] = ..., state: _Optional[_Union[RunState, str]] = ..., job_name: _Optional[str] = ..., namespace: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., message: _Optional[str] = ..., active_pods: _Optional[int] = ..., failed_pods: _Optional[int] = ...) -> None: ...

class TriggerRetrainingRequest(_message.Message):
    __slots__ = ("phase", "run_id")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    phase: TrainingPhase
    run_id: str
    def __init__(self, phase: _Optional[_Union[TrainingPhase, str]] = ..., run_id: _Optional[str] = ...) -> None: ...

class TriggerRetrainingResponse(_message.Message):
    __slots__ = ("run", "already_existed")
    RUN_FIELD_NUMBER: _ClassVar[int]
    ALREADY_EXISTED_FIELD_NUMBER: _ClassVar[int]
    run: TrainingRun
    already_existed: bool
    def __init__(self, run: _Optional[_Union[TrainingRun, _Mapping]] = ..., already_existed: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: TrainingRun
    def __init__(self, run: _Optional[_Union[TrainingRun, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("phase", "limit")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    phase: TrainingPhase
    limit: int
    def __init__(self, phase: _Optional[_Union[TrainingPhase, str]] = ..., limit: _Optional[int] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[TrainingRun]
    def __init__(self, runs: _Optional[_Iterable[_Union[TrainingRun, _Mapping]]] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("run", "already_cancelled")
    RUN_FIELD_NUMBER: _ClassVar[int]
    ALREADY_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    run: TrainingRun
    already_cancelled: bool
    def __init__(self, run: _Optional[_Union[TrainingRun, _Mapping]] = ..., already_cancelled: _Optional[bool] = ...) -> None: ...
