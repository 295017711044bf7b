from mascot.api.dialogue.v1 import dialogue_pb2 as _dialogue_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreCandidatesRequest(_message.Message):
    __slots__ = ("persona_id", "history", "context", "candidates")
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    history: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.Turn]
    context: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.ContextUtterance]
    candidates: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, persona_id: _Optional[str] = ..., history: _Optional[_Iterable[_Union[_dialogue_pb2.Turn, _Mapping]]] = ..., context: _Optional[_Iterable[_Union[_dialogue_pb2.ContextUtterance, _Mapping]]] = ..., candidates: _Optional[_Iterable[str]] = ...) -> None: ...

class Score(_message.Message):
    __slots__ = ("raw", "standardized", "truncated")
    RAW_FIELD_NUMBER: _ClassVar[int]
    STANDARDIZED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    raw: float
    standardized: float
    truncated: bool
    def __init__(self, raw: _Optional[float] = ..., standardized: _Optional[float] = ..., truncated: _Optional[bool] = ...) -> None: ...

class ScoreCandidatesResponse(_message.Message):
    __slots__ = ("scores", "model", "mu", "sigma", "trained")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MU_FIELD_NUMBER: _ClassVar[int]
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[Score]
    model: str
    mu: float
    sigma: float
    trained: bool
    def __init__(self, scores: _Optional[_Iterable[_Union[Score, _Mapping]]] = ..., model: _Optional[str] = ..., mu: _Optional[float] = ..., sigma: _Optional[float] = ..., trained: _Optional[bool] = ...) -> None: ...
