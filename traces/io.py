"""Reading user files safely and writing ours atomically."""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from traces.errors import SpecError

M = TypeVar("M", bound=BaseModel)

# Refuse absurd inputs before parsing: a YAML "billion laughs" expands anchors
# into huge structures; a size cap on the text plus an alias cap bound the work.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_ALIASES = 100


def _count_aliases(text: str) -> int:
    count = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(token, yaml.AliasToken):
            count += 1
            if count > MAX_ALIASES:
                break
    return count


def load_yaml_text(text: str, origin: str) -> Any:
    """Parse YAML with safe loading only; syntax errors name the file and line."""
    if len(text.encode("utf-8", "replace")) > MAX_FILE_BYTES:
        raise SpecError(f"{origin}: file larger than {MAX_FILE_BYTES // 1024**2} MiB; is this the right file?")
    try:
        if _count_aliases(text) > MAX_ALIASES:
            raise SpecError(f"{origin}: more than {MAX_ALIASES} YAML aliases; write the values out instead")
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{origin}:{mark.line + 1}" if mark else origin
        raise SpecError(f"{where}: YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:  # e.g. a control character: one line, no parser internals
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(f"{origin}: not valid YAML text: {first}") from None


def read_user_text(path: str | os.PathLike[str], kind: str = "YAML or JSON") -> str:
    """Text of a user file; a missing, unreadable or non-UTF-8 file is a one-line SpecError."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{p}: no such file; check the path") from None
    except IsADirectoryError:
        raise SpecError(f"{p}: is a folder; give a file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{p}: not UTF-8 text; save it as UTF-8 {kind}") from None
    except OSError as exc:
        raise SpecError(f"{p}: cannot read ({exc.strerror})") from None


def load_yaml(path: str | os.PathLike[str]) -> Any:
    """Load a user YAML (or JSON, a YAML subset) file."""
    return load_yaml_text(read_user_text(path), str(Path(path)))


def data_text(relative: str) -> str:
    """Text of a file shipped under traces/data/."""
    return resources.files("traces").joinpath("data", relative).read_text(encoding="utf-8")


def data_files(folder: str) -> list[str]:
    """Names of the files shipped in traces/data/<folder>."""
    root = resources.files("traces").joinpath("data", folder)
    return sorted(entry.name for entry in root.iterdir() if entry.is_file())


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def validate(model: type[M], data: Any, origin: str) -> M:
    """Build a pydantic model, turning its errors into one clear line."""
    if data is None:
        raise SpecError(f"{origin}: empty; expected a mapping of {model.__name__} fields")
    if not isinstance(data, dict):
        raise SpecError(
            f"{origin}: expected a mapping of {model.__name__} fields, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = _format_loc(err["loc"])
        kind = err["type"]
        if kind == "missing":
            msg = f"missing field '{field}'; add it"
        elif kind == "extra_forbidden":
            allowed = ", ".join(model.model_fields)
            msg = f"unknown field '{field}'; remove it (top-level fields: {allowed})"
        elif kind == "value_error":  # our own validators: the message already says what and how
            msg = f"field '{field}': {err['msg'].removeprefix('Value error, ')}"
        else:
            msg = f"field '{field}': {err['msg']}"
            if "input" in err and not isinstance(err["input"], (dict, list)):
                msg += f" (got {repr(err['input'])[:60]})"
        raise SpecError(f"{origin}: {msg}") from None


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a file so readers see the old or the new content, never half of it."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
