import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from mascot.api.dialogue.v1 import dialogue_pb2 as _dialogue_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateReplyRequest(_message.Message):
    __slots__ = ("persona_id", "user_simulation", "directive", "history", "context", "roster_persona_ids", "max_tokens", "seed", "adapter_version")
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    USER_SIMULATION_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ROSTER_PERSONA_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    user_simulation: _dialogue_pb2.UserSimulation
    directive: _dialogue_pb2.Directive
    history: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.Turn]
    context: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.ContextUtterance]
    roster_persona_ids: _containers.RepeatedScalarFieldContainer[str]
    max_tokens: int
    seed: int
    adapter_version: str
    def __init__(self, persona_id: _Optional[str] = ..., user_simulation: _Optional[_Union[_dialogue_pb2.UserSimulation, _Mapping]] = ..., directive: _Optional[_Union[_dialogue_pb2.Directive, _Mapping]] = ..., history: _Optional[_Iterable[_Union[_dialogue_pb2.Turn, _Mapping]]] = ..., context: _Optional[_Iterable[_Union[_dialogue_pb2.ContextUtterance, _Mapping]]] = ..., roster_persona_ids: _Optional[_Iterable[str]] = ..., max_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., adapter_version: _Optional[str] = ...) -> None: ...

class ReplyDelta(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ReplyFinal(_message.Message):
    __slots__ = ("text", "think", "adapter_version", "generated_tokens", "first_token", "truncated", "rejections", "rejected", "cut_reason", "attempts")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    THINK_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    CUT_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    text: str
    think: str
    adapter_version: str
    generated_tokens: int
    first_token: _duration_pb2.Duration
    truncated: bool
    rejections: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.ReplyRejection]
    rejected: bool
    cut_reason: str
    attempts: int
    def __init__(self, text: _Optional[str] = ..., think: _Optional[str] = ..., adapter_version: _Optional[str] = ..., generated_tokens: _Optional[int] = ..., first_token: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., truncated: _Optional[bool] = ..., rejections: _Optional[_Iterable[_Union[_dialogue_pb2.ReplyRejection, _Mapping]]] = ..., rejected: _Optional[bool] = ..., cut_reason: _Optional[str] = ..., attempts: _Optional[int] = ...) -> None: ...

class GenerateReplyResponse(_message.Message):
    __slots__ = ("delta", "final")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    delta: ReplyDelta
    final: ReplyFinal
    def __init__(self, delta: _Optional[_Union[ReplyDelta, _Mapping]] = ..., final: _Optional[_Union[ReplyFinal, _Mapping]] = ...) -> None: ...
