from mascot.api.dialogue.v1 import dialogue_pb2 as _dialogue_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Rubric(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUBRIC_UNSPECIFIED: _ClassVar[Rubric]
    RUBRIC_AGENT: _ClassVar[Rubric]
    RUBRIC_COLLECTIVE: _ClassVar[Rubric]

class JudgementStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JUDGEMENT_STATUS_UNSPECIFIED: _ClassVar[JudgementStatus]
    JUDGEMENT_STATUS_OK: _ClassVar[JudgementStatus]
    JUDGEMENT_STATUS_UNPARSEABLE: _ClassVar[JudgementStatus]
RUBRIC_UNSPECIFIED: Rubric
RUBRIC_AGENT: Rubric
RUBRIC_COLLECTIVE: Rubric
JUDGEMENT_STATUS_UNSPECIFIED: JudgementStatus
JUDGEMENT_STATUS_OK: JudgementStatus
JUDGEMENT_STATUS_UNPARSEABLE: JudgementStatus

class Candidate(_message.Message):
    __slots__ = ("candidate_id", "persona_id", "text", "block")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    persona_id: str
    text: str
    block: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.Turn]
    def __init__(self, candidate_id: _Optional[str] = ..., persona_id: _Optional[str] = ..., text: _Optional[str] = ..., block: _Optional[_Iterable[_Union[_dialogue_pb2.Turn, _Mapping]]] = ...) -> None: ...

class JudgeCandidatesRequest(_message.Message):
    __slots__ = ("rubric", "history", "context", "candidates", "judge", "roster_persona_ids")
    RUBRIC_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    JUDGE_FIELD_NUMBER: _ClassVar[int]
    ROSTER_PERSONA_IDS_FIELD_NUMBER: _ClassVar[int]
    rubric: Rubric
    history: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.Turn]
    context: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.ContextUtterance]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    judge: str
    roster_persona_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rubric: _Optional[_Union[Rubric, str]] = ..., history: _Optional[_Iterable[_Union[_dialogue_pb2.Turn, _Mapping]]] = ..., context: _Optional[_Iterable[_Union[_dialogue_pb2.ContextUtterance, _Mapping]]] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., judge: _Optional[str] = ..., roster_persona_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Judgement(_message.Message):
    __slots__ = ("candidate_id", "status", "scores", "rationale", "mean_score", "attempts", "cached", "error", "content_hash")
    class ScoresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    RATIONALE_FIELD_NUMBER: _ClassVar[int]
    MEAN_SCORE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    status: JudgementStatus
    scores: _containers.ScalarMap[str, int]
    rationale: str
    mean_score: float
    attempts: int
    cached: bool
    error: str
    content_hash: str
    def __init__(self, candidate_id: _Optional[str] = ..., status: _Optional[_Union[JudgementStatus, str]] = ..., scores: _Optional[_Mapping[str, int]] = ..., rationale: _Optional[str] = ..., mean_score: _Optional[float] = ..., attempts: _Optional[int] = ..., cached: _Optional[bool] = ..., error: _Optional[str] = ..., content_hash: _Optional[str] = ...) -> None: ...

class JudgeCandidatesResponse(_message.Message):
    __slots__ = ("judgements", "judge", "model", "rubric_version")
    JUDGEMENTS_FIELD_NUMBER: _ClassVar[int]
    JUDGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RUBRIC_VERSION_FIELD_NUMBER: _ClassVar[int]
    judgements: _containers.RepeatedCompositeFieldContainer[Judgement]
    judge: str
    model: str
    rubric_version: str
    def __init__(self, judgements: _Optional[_Iterable[_Union[Judgement, _Mapping]]] = ..., judge: _Optional[str] = ..., model: _Optional[str] = ..., rubric_version: _Optional[str] = ...) -> None: ...
