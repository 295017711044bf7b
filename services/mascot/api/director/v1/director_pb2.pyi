from mascot.api.dialogue.v1 import dialogue_pb2 as _dialogue_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NextDirectiveRequest(_message.Message):
    __slots__ = ("persona_ids", "history", "context", "seed", "adapter_version", "exclude_persona_ids")
    PERSONA_IDS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_PERSONA_IDS_FIELD_NUMBER: _ClassVar[int]
    persona_ids: _containers.RepeatedScalarFieldContainer[str]
    history: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.Turn]
    context: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.ContextUtterance]
    seed: int
    adapter_version: str
    exclude_persona_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, persona_ids: _Optional[_Iterable[str]] = ..., history: _Optional[_Iterable[_Union[_dialogue_pb2.Turn, _Mapping]]] = ..., context: _Optional[_Iterable[_Union[_dialogue_pb2.ContextUtterance, _Mapping]]] = ..., seed: _Optional[int] = ..., adapter_version: _Optional[str] = ..., exclude_persona_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class NextDirectiveResponse(_message.Message):
    __slots__ = ("directive", "retries", "raw_attempts", "parse_errors", "model_choice", "adapter_version")
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    RAW_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PARSE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    MODEL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    directive: _dialogue_pb2.Directive
    retries: int
    raw_attempts: _containers.RepeatedScalarFieldContainer[str]
    parse_errors: _containers.RepeatedScalarFieldContainer[str]
    model_choice: str
    adapter_version: str
    def __init__(self, directive: _Optional[_Union[_dialogue_pb2.Directive, _Mapping]] = ..., retries: _Optional[int] = ..., raw_attempts: _Optional[_Iterable[str]] = ..., parse_errors: _Optional[_Iterable[str]] = ..., model_choice: _Optional[str] = ..., adapter_version: _Optional[str] = ...) -> None: ...
