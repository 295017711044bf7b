import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_AGENT: _ClassVar[Role]

class DirectiveSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIRECTIVE_SOURCE_UNSPECIFIED: _ClassVar[DirectiveSource]
    DIRECTIVE_SOURCE_MODEL: _ClassVar[DirectiveSource]
    DIRECTIVE_SOURCE_RETRY: _ClassVar[DirectiveSource]
    DIRECTIVE_SOURCE_FALLBACK: _ClassVar[DirectiveSource]
    DIRECTIVE_SOURCE_SAFETY: _ClassVar[DirectiveSource]
    DIRECTIVE_SOURCE_RANDOM: _ClassVar[DirectiveSource]

class TraitLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAIT_LEVEL_UNSPECIFIED: _ClassVar[TraitLevel]
    TRAIT_LEVEL_LOW: _ClassVar[TraitLevel]
    TRAIT_LEVEL_HIGH: _ClassVar[TraitLevel]
ROLE_UNSPECIFIED: Role
ROLE_USER: Role
ROLE_AGENT: Role
DIRECTIVE_SOURCE_UNSPECIFIED: DirectiveSource
DIRECTIVE_SOURCE_MODEL: DirectiveSource
DIRECTIVE_SOURCE_RETRY: DirectiveSource
DIRECTIVE_SOURCE_FALLBACK: DirectiveSource
DIRECTIVE_SOURCE_SAFETY: DirectiveSource
DIRECTIVE_SOURCE_RANDOM: DirectiveSource
TRAIT_LEVEL_UNSPECIFIED: TraitLevel
TRAIT_LEVEL_LOW: TraitLevel
TRAIT_LEVEL_HIGH: TraitLevel

class Directive(_message.Message):
    __slots__ = ("persona_id", "action", "tone", "source", "raw")
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TONE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    action: str
    tone: str
    source: DirectiveSource
    raw: str
    def __init__(self, persona_id: _Optional[str] = ..., action: _Optional[str] = ..., tone: _Optional[str] = ..., source: _Optional[_Union[DirectiveSource, str]] = ..., raw: _Optional[str] = ...) -> None: ...

class TurnTimings(_message.Message):
    __slots__ = ("latency", "first_token", "director")
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DIRECTOR_FIELD_NUMBER: _ClassVar[int]
    latency: _duration_pb2.Duration
    first_token: _duration_pb2.Duration
    director: _duration_pb2.Duration
    def __init__(self, latency: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., first_token: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., director: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("index", "role", "persona_id", "directive", "adapter_version", "text", "think", "safety", "create_time", "timings", "rejections", "cut_reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    THINK_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    CUT_REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    role: Role
    persona_id: str
    directive: Directive
    adapter_version: str
    text: str
    think: str
    safety: bool
    create_time: _timestamp_pb2.Timestamp
    timings: TurnTimings
    rejections: _containers.RepeatedCompositeFieldContainer[ReplyRejection]
    cut_reason: str
    def __init__(self, index: _Optional[int] = ..., role: _Optional[_Union[Role, str]] = ..., persona_id: _Optional[str] = ..., directive: _Optional[_Union[Directive, _Mapping]] = ..., adapter_version: _Optional[str] = ..., text: _Optional[str] = ..., think: _Optional[str] = ..., safety: _Optional[bool] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., timings: _Optional[_Union[TurnTimings, _Mapping]] = ..., rejections: _Optional[_Iterable[_Union[ReplyRejection, _Mapping]]] = ..., cut_reason: _Optional[str] = ...) -> None: ...

class ReplyRejection(_message.Message):
    __slots__ = ("persona_id", "attempt", "reason", "text")
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    attempt: int
    reason: str
    text: str
    def __init__(self, persona_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class ContextUtterance(_message.Message):
    __slots__ = ("speaker", "content")
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    speaker: str
    content: str
    def __init__(self, speaker: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class BigFive(_message.Message):
    __slots__ = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")
    OPENNESS_FIELD_NUMBER: _ClassVar[int]
    CONSCIENTIOUSNESS_FIELD_NUMBER: _ClassVar[int]
    EXTRAVERSION_FIELD_NUMBER: _ClassVar[int]
    AGREEABLENESS_FIELD_NUMBER: _ClassVar[int]
    NEUROTICISM_FIELD_NUMBER: _ClassVar[int]
    openness: TraitLevel
    conscientiousness: TraitLevel
    extraversion: TraitLevel
    agreeableness: TraitLevel
    neuroticism: TraitLevel
    def __init__(self, openness: _Optional[_Union[TraitLevel, str]] = ..., conscientiousness: _Optional[_Union[TraitLevel, str]] = ..., extraversion: _Optional[_Union[TraitLevel, str]] = ..., agreeableness: _Optional[_Union[TraitLevel, str]] = ..., neuroticism: _Optional[_Union[TraitLevel, str]] = ...) -> None: ...

class UserSimulation(_message.Message):
    __slots__ = ("situation", "emotion", "mbti", "big_five")
    SITUATION_FIELD_NUMBER: _ClassVar[int]
    EMOTION_FIELD_NUMBER: _ClassVar[int]
    MBTI_FIELD_NUMBER: _ClassVar[int]
    BIG_FIVE_FIELD_NUMBER: _ClassVar[int]
    situation: str
    emotion: str
    mbti: str
    big_five: BigFive
    def __init__(self, situation: _Optional[str] = ..., emotion: _Optional[str] = ..., mbti: _Optional[str] = ..., big_five: _Optional[_Union[BigFive, _Mapping]] = ...) -> None: ...

class Persona(_message.Message):
    __slots__ = ("id", "name", "role", "goal", "default_tone", "persona_set", "max_answer_words")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TONE_FIELD_NUMBER: _ClassVar[int]
    PERSONA_SET_FIELD_NUMBER: _ClassVar[int]
    MAX_ANSWER_WORDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    role: str
    goal: str
    default_tone: str
    persona_set: str
    max_answer_words: int
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., role: _Optional[str] = ..., goal: _Optional[str] = ..., default_tone: _Optional[str] = ..., persona_set: _Optional[str] = ..., max_answer_words: _Optional[int] = ...) -> None: ...
