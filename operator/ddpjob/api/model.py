"""The model kit: how the API's frozen dataclasses carry their facts, and the one codec.

``spec.py`` and ``status.py`` declare the API as frozen dataclasses whose fields carry their
schema facts in ``dataclasses.field(metadata=...)`` (``spec_field``, ``status.status_field``),
and whose cross-field rules are ``Rule``s in a class attribute ``RULES``. Two modules read
them: ``openapi.py`` (the CRD's schema) and ``validation.py`` (``ddpjob validate``). The codec
here turns a dataclass into the plain JSON-like value the API server holds and back, for the
spec (``to_manifest``, ``parse_ddpjob``) and the status (``JobStatus.to_dict``/``from_dict``).

Field facts the codec reads (both optional, status fields only today):

* ``blank_is_unset``: an empty string means "not set" (as None does): left out when written,
  read back as the field's default.
* ``patch_null``: an unset value is written as null instead of being left out, even where
  the writer does not know what the server holds.

The status is sent as a JSON merge patch, in which a left-out key keeps its old value:
``merge_patch`` adds a null for every key the server holds that the new value lacks, so that
clearing any field (a blank ETA once the job is over) clears it on the server too.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional

# spec_field keyword -> OpenAPI keyword, for the constraints that sit on a value (or a list item).
VALUE_KEYWORDS = {"minimum": "minimum", "maximum": "maximum", "pattern": "pattern",
                  "min_length": "minLength", "max_length": "maxLength"}
LIST_KEYWORDS = {"min_items": "minItems", "max_items": "maxItems"}
CODEC_KEYS = ("blank_is_unset", "patch_null")
#: Every key a field's metadata may hold: a misspelt one is refused by the schema generator.
FIELD_KEYS = frozenset({"description", "required", "enum", "unique_items", "list_map_keys", "openapi",
                        "format", "status", *VALUE_KEYWORDS, *LIST_KEYWORDS, *CODEC_KEYS})


def spec_field(description: str, *, default: Any = ..., default_factory: Any = None, **schema: Any):
    """A dataclass field with its schema facts in ``metadata``.

    ``schema`` keys (all optional): minimum, maximum, enum, pattern, min_length, max_length,
    min_items, max_items, unique_items, openapi (a raw OpenAPI fragment for Kubernetes types
    that are copied through verbatim, e.g. a Toleration), required (bool: no default).
    On a list field, minimum/maximum/enum/pattern/min_length/max_length and ``openapi``
    describe each item; min_items/max_items/unique_items describe the list.
    """
    metadata = {"description": description, **schema}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    if default is ...:
        metadata["required"] = True
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: CEL for the API server, a Python predicate for `ddpjob validate`.

    ``cel`` is evaluated with ``self`` bound to the object the rule is declared on; ``check``
    gets the same object as a plain dict (after defaults) and returns True when valid.
    ``field_path`` is relative to that object, in the API server's JSONPath-like form.
    """

    cel: str
    message: str
    check: Callable[..., bool]
    field_path: Optional[str] = None
    #: A transition rule (CEL reads ``oldSelf``): checked on updates only, and ``check`` gets
    #: ``(new, old)``, both defaulted plain dicts.
    transition: bool = False


def unwrap_optional(hint: Any) -> Any:
    """``Optional[X]`` -> ``X``; any other hint unchanged."""
    if typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def dataclasses_under(cls: type) -> Iterator[type]:
    """``cls`` and every dataclass nested in its fields, depth first, in field order."""
    yield cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner = unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(inner):
            yield from dataclasses_under(inner)


# ---------------------------------------------------------------------------------------------
# The codec: dataclasses <-> plain JSON-like values
# ---------------------------------------------------------------------------------------------
def to_plain(value: Any) -> Any:
    """Dataclasses, tuples and mappings -> JSON-like dicts and lists.

    An unset field (None, or blank where ``blank_is_unset``) is left out, or written as null
    where ``patch_null``. A class's ``COMPUTED`` entries (name, the field it follows, its schema)
    are written from the property of that name, right after the field they follow.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for plan in _plan(type(value)):
            item = getattr(value, plan.name)
            if not (item is None or (plan.blank_is_unset and item == "")):
                out[plan.name] = plan.encode(item)
            elif plan.patch_null:
                out[plan.name] = None
            if plan.computed_after:
                out.update((name, getattr(value, name)) for name in plan.computed_after)
        return out
    if isinstance(value, AbcMapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def from_plain(cls: type, data: Optional[Mapping[str, Any]]) -> Any:
    """A plain mapping -> an instance of the dataclass ``cls``; the inverse of ``to_plain``.

    Lenient, because the status is read from whatever the API server holds: a missing, null
    (or, where ``blank_is_unset``, blank) field gets its default, and so does a blank number;
    an empty mapping for an optional nested object is None; scalars are coerced to the field's
    type (``int("3")``). A manifest, validated and defaulted before, passes through unchanged.
    """
    data = data or {}
    kwargs = {}
    for plan in _plan(cls):
        value = data.get(plan.name)
        # A blank number or flag has no value either (the status once read ``int(x or 0)``).
        if not (value is None or ((plan.blank_is_unset or plan.number) and value == "")):
            kwargs[plan.name] = plan.decode(value)
    return cls(**kwargs)


@dataclass(frozen=True)
class _FieldPlan:
    """How the codec writes and reads one field, worked out once per class (a status of
    thousands of nodes is read on every reconcile pass)."""

    name: str
    blank_is_unset: bool
    patch_null: bool
    number: bool
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    computed_after: tuple[str, ...]


@functools.lru_cache(maxsize=None)
def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    hints = typing.get_type_hints(cls)
    computed = getattr(cls, "COMPUTED", ())
    plans = []
    for f in dataclasses.fields(cls):
        inner = unwrap_optional(hints[f.name])
        plans.append(_FieldPlan(
            name=f.name, blank_is_unset=f.metadata.get("blank_is_unset", False),
            patch_null=f.metadata.get("patch_null", False), number=inner in (int, float, bool),
            encode=_identity if inner in _SCALARS else to_plain, decode=_decoder(hints[f.name]),
            computed_after=tuple(name for name, after, _ in computed if after == f.name)))
    return tuple(plans)


_SCALARS = (int, str, bool, float)


def _identity(value: Any) -> Any:
    return value


def _decoder(hint: Any) -> Callable[[Any], Any]:
    """The function that reads a (set) value of type ``hint``."""
    inner = unwrap_optional(hint)
    if dataclasses.is_dataclass(inner):
        if inner is not hint:  # an optional object written as {} is not set
            return lambda value: None if isinstance(value, AbcMapping) and not value else from_plain(inner, value)
        return lambda value: from_plain(inner, value)
    if typing.get_origin(inner) is tuple:
        item = _decoder(typing.get_args(inner)[0])
        return lambda value: tuple(item(v) for v in value)
    if inner in _SCALARS:
        return inner
    return _identity  # a mapping or a raw Kubernetes fragment: as it is


def merge_patch(new: Mapping[str, Any], *held: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) that turns what the server may hold (any of ``held``)
    into ``new``: ``new`` itself, plus a null for each key of a held object that ``new`` leaves
    out, at every depth where both sides are objects (lists are replaced whole)."""
    out: dict[str, Any] = dict(new)
    for old in held:
        if not isinstance(old, AbcMapping):
            continue
        for key, was in old.items():
            if key not in new:
                out[key] = None
            elif isinstance(was, AbcMapping) and isinstance(new[key], AbcMapping):
                out[key] = merge_patch(out[key] if isinstance(out[key], AbcMapping) else new[key], was)
    return out


_R = typing.TypeVar("_R", bound="Record")


class Record:
    """A base for model dataclasses read from and written to the API server as plain dicts."""

    def to_dict(self) -> dict[str, Any]:
        """This record as the API server holds it (``to_plain``)."""
        return to_plain(self)

    @classmethod
    def from_dict(cls: type[_R], data: Optional[Mapping[str, Any]]) -> _R:
        """A record from what the API server holds (``from_plain``: lenient)."""
        return from_plain(cls, data)
