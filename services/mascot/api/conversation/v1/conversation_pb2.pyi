import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from mascot.api.dialogue.v1 import dialogue_pb2 as _dialogue_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_SUPPORT: _ClassVar[Mode]
    MODE_MEETING: _ClassVar[Mode]

class RoundEndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUND_END_REASON_UNSPECIFIED: _ClassVar[RoundEndReason]
    ROUND_END_REASON_COMPLETED: _ClassVar[RoundEndReason]
    ROUND_END_REASON_EMPTY_REPLIES: _ClassVar[RoundEndReason]
    ROUND_END_REASON_SAFETY: _ClassVar[RoundEndReason]
    ROUND_END_REASON_INTERRUPTED: _ClassVar[RoundEndReason]
MODE_UNSPECIFIED: Mode
MODE_SUPPORT: Mode
MODE_MEETING: Mode
ROUND_END_REASON_UNSPECIFIED: RoundEndReason
ROUND_END_REASON_COMPLETED: RoundEndReason
ROUND_END_REASON_EMPTY_REPLIES: RoundEndReason
ROUND_END_REASON_SAFETY: RoundEndReason
ROUND_END_REASON_INTERRUPTED: RoundEndReason

class Conversation(_message.Message):
    __slots__ = ("id", "mode", "persona_ids", "source_id", "context", "turns", "create_time", "adapter_versions", "safety_flagged", "safety_categories")
    class AdapterVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PERSONA_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FLAGGED_FIELD_NUMBER: _ClassVar[int]
    SAFETY_CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    id: str
    mode: Mode
    persona_ids: _containers.RepeatedScalarFieldContainer[str]
    source_id: str
    context: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.ContextUtterance]
    turns: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.Turn]
    create_time: _timestamp_pb2.Timestamp
    adapter_versions: _containers.ScalarMap[str, str]
    safety_flagged: bool
    safety_categories: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., mode: _Optional[_Union[Mode, str]] = ..., persona_ids: _Optional[_Iterable[str]] = ..., source_id: _Optional[str] = ..., context: _Optional[_Iterable[_Union[_dialogue_pb2.ContextUtterance, _Mapping]]] = ..., turns: _Optional[_Iterable[_Union[_dialogue_pb2.Turn, _Mapping]]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., adapter_versions: _Optional[_Mapping[str, str]] = ..., safety_flagged: _Optional[bool] = ..., safety_categories: _Optional[_Iterable[str]] = ...) -> None: ...

class StartConversationRequest(_message.Message):
    __slots__ = ("mode", "persona_ids", "context", "source_id")
    MODE_FIELD_NUMBER: _ClassVar[int]
    PERSONA_IDS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    persona_ids: _containers.RepeatedScalarFieldContainer[str]
    context: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.ContextUtterance]
    source_id: str
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., persona_ids: _Optional[_Iterable[str]] = ..., context: _Optional[_Iterable[_Union[_dialogue_pb2.ContextUtterance, _Mapping]]] = ..., source_id: _Optional[str] = ...) -> None: ...

class StartConversationResponse(_message.Message):
    __slots__ = ("conversation",)
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    conversation: Conversation
    def __init__(self, conversation: _Optional[_Union[Conversation, _Mapping]] = ...) -> None: ...

class SendMessageRequest(_message.Message):
    __slots__ = ("conversation_id", "text", "idempotency_key")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    text: str
    idempotency_key: str
    def __init__(self, conversation_id: _Optional[str] = ..., text: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class RoundStarted(_message.Message):
    __slots__ = ("user_turn", "replayed")
    USER_TURN_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    user_turn: _dialogue_pb2.Turn
    replayed: bool
    def __init__(self, user_turn: _Optional[_Union[_dialogue_pb2.Turn, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class TurnStarted(_message.Message):
    __slots__ = ("index", "role", "directive")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    index: int
    role: _dialogue_pb2.Role
    directive: _dialogue_pb2.Directive
    def __init__(self, index: _Optional[int] = ..., role: _Optional[_Union[_dialogue_pb2.Role, str]] = ..., directive: _Optional[_Union[_dialogue_pb2.Directive, _Mapping]] = ...) -> None: ...

class TurnDelta(_message.Message):
    __slots__ = ("index", "text")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class TurnCompleted(_message.Message):
    __slots__ = ("turn",)
    TURN_FIELD_NUMBER: _ClassVar[int]
    turn: _dialogue_pb2.Turn
    def __init__(self, turn: _Optional[_Union[_dialogue_pb2.Turn, _Mapping]] = ...) -> None: ...

class RoundCompleted(_message.Message):
    __slots__ = ("agent_turns", "reason")
    AGENT_TURNS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    agent_turns: int
    reason: RoundEndReason
    def __init__(self, agent_turns: _Optional[int] = ..., reason: _Optional[_Union[RoundEndReason, str]] = ...) -> None: ...

class ConversationEvent(_message.Message):
    __slots__ = ("round_started", "turn_started", "turn_delta", "turn_completed", "round_completed")
    ROUND_STARTED_FIELD_NUMBER: _ClassVar[int]
    TURN_STARTED_FIELD_NUMBER: _ClassVar[int]
    TURN_DELTA_FIELD_NUMBER: _ClassVar[int]
    TURN_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    ROUND_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    round_started: RoundStarted
    turn_started: TurnStarted
    turn_delta: TurnDelta
    turn_completed: TurnCompleted
    round_completed: RoundCompleted
    def __init__(self, round_started: _Optional[_Union[RoundStarted, _Mapping]] = ..., turn_started: _Optional[_Union[TurnStarted, _Mapping]] = ..., turn_delta: _Optional[_Union[TurnDelta, _Mapping]] = ..., turn_completed: _Optional[_Union[TurnCompleted, _Mapping]] = ..., round_completed: _Optional[_Union[RoundCompleted, _Mapping]] = ...) -> None: ...

class SendMessageResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: ConversationEvent
    def __init__(self, event: _Optional[_Union[ConversationEvent, _Mapping]] = ...) -> None: ...

class RunSelfPlayRequest(_message.Message):
    __slots__ = ("conversation_id", "opening_text", "user", "agent_turns", "user_speak_prob", "seed")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    OPENING_TEXT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    AGENT_TURNS_FIELD_NUMBER: _ClassVar[int]
    USER_SPEAK_PROB_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    opening_text: str
    user: _dialogue_pb2.UserSimulation
    agent_turns: int
    user_speak_prob: float
    seed: int
    def __init__(self, conversation_id: _Optional[str] = ..., opening_text: _Optional[str] = ..., user: _Optional[_Union[_dialogue_pb2.UserSimulation, _Mapping]] = ..., agent_turns: _Optional[int] = ..., user_speak_prob: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class RunSelfPlayResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: ConversationEvent
    def __init__(self, event: _Optional[_Union[ConversationEvent, _Mapping]] = ...) -> None: ...

class GetConversationRequest(_message.Message):
    __slots__ = ("conversation_id", "include_think", "page_size", "page_token")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_THINK_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    include_think: bool
    page_size: int
    page_token: str
    def __init__(self, conversation_id: _Optional[str] = ..., include_think: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetConversationResponse(_message.Message):
    __slots__ = ("conversation", "director_retries", "director_fallbacks", "next_page_token")
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    DIRECTOR_RETRIES_FIELD_NUMBER: _ClassVar[int]
    DIRECTOR_FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    conversation: Conversation
    director_retries: int
    director_fallbacks: int
    next_page_token: str
    def __init__(self, conversation: _Optional[_Union[Conversation, _Mapping]] = ..., director_retries: _Optional[int] = ..., director_fallbacks: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteConversationRequest(_message.Message):
    __slots__ = ("conversation_id",)
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    def __init__(self, conversation_id: _Optional[str] = ...) -> None: ...

class DeleteConversationResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPersonasRequest(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ...) -> None: ...

class ListPersonasResponse(_message.Message):
    __slots__ = ("personas",)
    PERSONAS_FIELD_NUMBER: _ClassVar[int]
    personas: _containers.RepeatedCompositeFieldContainer[_dialogue_pb2.Persona]
    def __init__(self, personas: _Optional[_Iterable[_Union[_dialogue_pb2.Persona, _Mapping]]] = ...) -> None: ...
