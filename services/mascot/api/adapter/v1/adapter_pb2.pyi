from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AdapterState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADAPTER_STATE_UNSPECIFIED: _ClassVar[AdapterState]
    ADAPTER_STATE_STAGED: _ClassVar[AdapterState]
    ADAPTER_STATE_CANARY: _ClassVar[AdapterState]
    ADAPTER_STATE_STABLE: _ClassVar[AdapterState]
    ADAPTER_STATE_RETIRED: _ClassVar[AdapterState]
ADAPTER_STATE_UNSPECIFIED: AdapterState
ADAPTER_STATE_STAGED: AdapterState
ADAPTER_STATE_CANARY: AdapterState
ADAPTER_STATE_STABLE: AdapterState
ADAPTER_STATE_RETIRED: AdapterState

class AdapterVersion(_message.Message):
    __slots__ = ("version", "name", "state", "digest", "create_time")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    version: int
    name: str
    state: AdapterState
    digest: str
    create_time: str
    def __init__(self, version: _Optional[int] = ..., name: _Optional[str] = ..., state: _Optional[_Union[AdapterState, str]] = ..., digest: _Optional[str] = ..., create_time: _Optional[str] = ...) -> None: ...

class PersonaAdapters(_message.Message):
    __slots__ = ("persona_id", "versions", "stable", "canary", "canary_weight", "previous_stable")
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    STABLE_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    CANARY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STABLE_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    versions: _containers.RepeatedCompositeFieldContainer[AdapterVersion]
    stable: int
    canary: int
    canary_weight: float
    previous_stable: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, persona_id: _Optional[str] = ..., versions: _Optional[_Iterable[_Union[AdapterVersion, _Mapping]]] = ..., stable: _Optional[int] = ..., canary: _Optional[int] = ..., canary_weight: _Optional[float] = ..., previous_stable: _Optional[_Iterable[int]] = ...) -> None: ...

class ListAdaptersRequest(_message.Message):
    __slots__ = ("persona_id",)
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    def __init__(self, persona_id: _Optional[str] = ...) -> None: ...

class ListAdaptersResponse(_message.Message):
    __slots__ = ("revision", "personas")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PERSONAS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    personas: _containers.RepeatedCompositeFieldContainer[PersonaAdapters]
    def __init__(self, revision: _Optional[int] = ..., personas: _Optional[_Iterable[_Union[PersonaAdapters, _Mapping]]] = ...) -> None: ...

class PublishAdapterRequest(_message.Message):
    __slots__ = ("persona_id", "source_path", "run_id", "data_ids", "eval_metrics_json")
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PATH_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_IDS_FIELD_NUMBER: _ClassVar[int]
    EVAL_METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    source_path: str
    run_id: str
    data_ids: _containers.RepeatedScalarFieldContainer[str]
    eval_metrics_json: str
    def __init__(self, persona_id: _Optional[str] = ..., source_path: _Optional[str] = ..., run_id: _Optional[str] = ..., data_ids: _Optional[_Iterable[str]] = ..., eval_metrics_json: _Optional[str] = ...) -> None: ...

class PublishAdapterResponse(_message.Message):
    __slots__ = ("version", "already_published", "revision")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ALREADY_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    version: AdapterVersion
    already_published: bool
    revision: int
    def __init__(self, version: _Optional[_Union[AdapterVersion, _Mapping]] = ..., already_published: _Optional[bool] = ..., revision: _Optional[int] = ...) -> None: ...

class PromoteAdapterRequest(_message.Message):
    __slots__ = ("persona_id", "version", "canary_weight", "skip_eval_gate")
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SKIP_EVAL_GATE_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    version: int
    canary_weight: float
    skip_eval_gate: bool
    def __init__(self, persona_id: _Optional[str] = ..., version: _Optional[int] = ..., canary_weight: _Optional[float] = ..., skip_eval_gate: _Optional[bool] = ...) -> None: ...

class EvalGateResult(_message.Message):
    __slots__ = ("ran", "candidate", "baseline", "candidate_score", "baseline_score", "situations", "passed", "candidate_compliance", "baseline_compliance", "replies")
    RAN_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_SCORE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_SCORE_FIELD_NUMBER: _ClassVar[int]
    SITUATIONS_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_COMPLIANCE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_COMPLIANCE_FIELD_NUMBER: _ClassVar[int]
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    ran: bool
    candidate: str
    baseline: str
    candidate_score: float
    baseline_score: float
    situations: int
    passed: bool
    candidate_compliance: float
    baseline_compliance: float
    replies: int
    def __init__(self, ran: _Optional[bool] = ..., candidate: _Optional[str] = ..., baseline: _Optional[str] = ..., candidate_score: _Optional[float] = ..., baseline_score: _Optional[float] = ..., situations: _Optional[int] = ..., passed: _Optional[bool] = ..., candidate_compliance: _Optional[float] = ..., baseline_compliance: _Optional[float] = ..., replies: _Optional[int] = ...) -> None: ...

class PromoteAdapterResponse(_message.Message):
    __slots__ = ("persona", "revision", "eval_gate")
    PERSONA_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    EVAL_GATE_FIELD_NUMBER: _ClassVar[int]
    persona: PersonaAdapters
    revision: int
    eval_gate: EvalGateResult
    def __init__(self, persona: _Optional[_Union[PersonaAdapters, _Mapping]] = ..., revision: _Optional[int] = ..., eval_gate: _Optional[_Union[EvalGateResult, _Mapping]] = ...) -> None: ...

class RollbackAdapterRequest(_message.Message):
    __slots__ = ("persona_id",)
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    def __init__(self, persona_id: _Optional[str] = ...) -> None: ...

class RollbackAdapterResponse(_message.Message):
    __slots__ = ("persona", "revision")
    PERSONA_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    persona: PersonaAdapters
    revision: int
    def __init__(self, persona: _Optional[_Union[PersonaAdapters, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class RetireAdapterRequest(_message.Message):
    __slots__ = ("persona_id", "version")
    PERSONA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    persona_id: str
    version: int
    def __init__(self, persona_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class RetireAdapterResponse(_message.Message):
    __slots__ = ("persona", "revision")
    PERSONA_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    persona: PersonaAdapters
    revision: int
    def __init__(self, persona: _Optional[_Union[PersonaAdapters, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("id", "time", "actor", "role", "via", "method", "target", "outcome", "message", "detail_json", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    time: str
    actor: str
    role: str
    via: str
    method: str
    target: str
    outcome: str
    message: str
    detail_json: str
    request_id: str
    def __init__(self, id: _Optional[int] = ..., time: _Optional[str] = ..., actor: _Optional[str] = ..., role: _Optional[str] = ..., via: _Optional[str] = ..., method: _Optional[str] = ..., target: _Optional[str] = ..., outcome: _Optional[str] = ..., message: _Optional[str] = ..., detail_json: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListAuditEventsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "actor", "method", "target")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    actor: str
    method: str
    target: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., actor: _Optional[str] = ..., method: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class ListAuditEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
