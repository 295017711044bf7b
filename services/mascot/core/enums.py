"""Names of proto enum values, read from the enum descriptors: the one rule every module uses.

A value's name is its proto name without the enum's prefix (the enum name in UPPER_SNAKE_CASE plus ``_``, the
buf ``ENUM_VALUE_PREFIX`` rule), lower-cased: ``DIRECTIVE_SOURCE_FALLBACK`` of ``DirectiveSource`` is
``fallback``, ``ROUND_END_REASON_EMPTY_REPLIES`` of ``RoundEndReason`` is ``empty_replies``. Words are joined by
``_`` unless ``sep`` says otherwise (``sep="-"`` gives the training phase ``persona-alignment``). The zero value
(``*_UNSPECIFIED``) has the name ``unspecified`` but is left out of :func:`enum_names`.

``enum_type`` is a generated enum (``dialogue_pb2.DirectiveSource``) or its ``EnumDescriptor``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from google.protobuf.descriptor import EnumDescriptor

_RAISE: Any = object()


def _descriptor(enum_type: Any) -> EnumDescriptor:
    d = enum_type if isinstance(enum_type, EnumDescriptor) else getattr(enum_type, "DESCRIPTOR", None)
    if not isinstance(d, EnumDescriptor):
        raise TypeError(f"expected a proto enum or its EnumDescriptor, got {type(enum_type).__name__}")
    return d


@lru_cache(maxsize=None)
def _table(d: EnumDescriptor, sep: str) -> tuple[dict[int, str], dict[str, int]]:
    """``({number: name}, {name: number})`` of ``d`` (names as the module docstring says)."""
    prefix = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", d.name).upper() + "_"
    by_number: dict[int, str] = {}
    for number, v in d.values_by_number.items():
        name = v.name[len(prefix):] if v.name.startswith(prefix) else v.name
        by_number[number] = name.lower().replace("_", sep)
    return by_number, {name: number for number, name in by_number.items()}


def enum_name(enum_type: Any, number: int, *, sep: str = "_", default: Any = _RAISE) -> str:
    """The name of value ``number`` of ``enum_type`` (``enum_name(DirectiveSource, 3) == "fallback"``).

    Args:
        default: Returned for a number the enum does not define (a newer peer's value); without it that raises.

    Raises:
        ValueError: ``number`` is not a value of the enum and no ``default`` was given.
        TypeError: ``enum_type`` is not a proto enum.
    """
    by_number, _ = _table(_descriptor(enum_type), sep)
    if number in by_number:
        return by_number[number]
    if default is _RAISE:
        raise ValueError(f"{number} is not a value of {_descriptor(enum_type).full_name}")
    return default


def enum_value(enum_type: Any, name: str, *, sep: str = "_", default: Any = _RAISE) -> int:
    """The number of the value named ``name`` (:func:`enum_name`'s inverse; ``enum_value(Mode, "meeting") == 2``).

    Raises:
        ValueError: no value has that name and no ``default`` was given (the message lists the names).
        TypeError: ``enum_type`` is not a proto enum.
    """
    _, by_name = _table(_descriptor(enum_type), sep)
    if name in by_name:
        return by_name[name]
    if default is _RAISE:
        raise ValueError(f"{name!r} is not one of {', '.join(enum_names(enum_type, sep=sep))}")
    return default


def enum_names(enum_type: Any, *, sep: str = "_") -> tuple[str, ...]:
    """The names of every value but the zero (unspecified) one, in number order
    (``enum_names(Mode) == ("support", "meeting")``).

    Raises:
        TypeError: ``enum_type`` is not a proto enum.
    """
    by_number, _ = _table(_descriptor(enum_type), sep)
    return tuple(name for number, name in sorted(by_number.items()) if number != 0)
