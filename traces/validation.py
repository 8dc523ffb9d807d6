"""Building a pydantic model from user data, every error turned into part of one clear line.

All of pydantic's errors are listed (the first MAX_LISTED of them, then a count), each naming the
field by its path (e.g. node_groups.0.nodes) and what to do; an unknown field's hint lists the
fields of the model it sits in, not the top level's.
"""

from __future__ import annotations

import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from traces.errors import SpecError, did_you_mean

M = TypeVar("M", bound=BaseModel)
MAX_LISTED = 5  # more would not read as one line; the count says how many are left


def validate(model: type[M], data: Any, origin: str) -> M:
    """Build a pydantic model, turning its errors into one clear line (a SpecError)."""
    if data is None:
        raise SpecError(f"{origin}: empty; expected a mapping of {model.__name__} fields")
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: expected a mapping of {model.__name__} fields, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        problems = list(dict.fromkeys(describe(model, err) for err in errors if not _echo(err, errors)))
        listed = "; ".join(problems[:MAX_LISTED])
        more = len(problems) - MAX_LISTED
        raise SpecError(f"{origin}: {listed}" + (f"; and {more} more" if more > 0 else "")) from None


def describe(model: type[BaseModel], err: ErrorDetails) -> str:
    """One pydantic error as `field '<path>': <what>` with the fix where we know it."""
    loc = tuple(err["loc"])
    field = ".".join(str(part) for part in loc) or "(top level)"
    kind = err["type"]
    if kind == "missing":
        return f"missing field '{field}'; add it"
    if kind == "extra_forbidden":
        owner = model_at(model, loc[:-1])
        siblings = list(owner.model_fields) if owner is not None else []
        return f"unknown field '{field}'; remove it{did_you_mean(str(loc[-1]), siblings)}"
    if kind == "value_error":  # our own validators: the message already says what and how
        return f"field '{field}': {err['msg'].removeprefix('Value error, ')}"
    msg = f"field '{field}': {err['msg']}"
    if "input" in err and not isinstance(err["input"], (dict, list, tuple)):
        msg += f" (got {repr(err['input'])[:60]})"
    return msg


def _echo(err: ErrorDetails, errors: list[ErrorDetails]) -> bool:
    """pydantic adds "too short" for a list whose items failed: the items' own errors say it all."""
    loc = tuple(err["loc"])
    return err["type"] == "too_short" and any(tuple(e["loc"])[: len(loc)] == loc and len(e["loc"]) > len(loc)
                                              for e in errors)


def model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that a location inside `model` names (list and tuple indices skipped)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None or part not in current.model_fields:
            return None
        current = _model_in(current.model_fields[part].annotation)
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside a field's type: the type itself, or inside Optional/tuple/list/union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
