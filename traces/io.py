"""Reading user files safely: size-capped, regular files only, YAML/JSON without duplicate keys.

Writing (traces.atomic_write) and validation (traces.validation) live in their own modules; their
helpers are re-exported here, where the rest of the code has always imported them from.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from traces.atomic_write import atomic_write_bytes, atomic_write_text, check_target, ensure_folder
from traces.errors import SpecError
from traces.os_errors import spec_error, special_kind
from traces.validation import validate

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "check_target",
    "data_files",
    "data_text",
    "ensure_folder",
    "load_yaml",
    "load_yaml_text",
    "loads_json",
    "read_user_bytes",
    "read_user_text",
    "validate",
]

# Refuse absurd inputs before parsing: a YAML "billion laughs" expands anchors
# into huge structures; a size cap on the text plus an alias cap bound the work.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_ALIASES = 100


def read_user_bytes(path: str | os.PathLike[str], cap: int = MAX_FILE_BYTES) -> bytes:
    """A user's file, at most `cap` bytes of it read: folders, FIFOs, devices and links that lead
    nowhere are refused in one line (SpecError), before anything is read."""
    p = Path(path)
    try:
        _refuse_special(p, os.stat(p).st_mode)  # before opening: opening a device may already act
        # O_NONBLOCK: a FIFO swapped in after the check must not block the open; fstat catches it
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise spec_error(exc, p) from None
    except ValueError:  # a NUL character: no OS call takes it
        raise SpecError(f"{str(p)!r}: a path cannot hold a NUL character (fix the path)") from None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        _refuse_special(p, st.st_mode)
        if st.st_size > cap:  # a sparse 2 GB file is refused without a byte read
            _too_large(p, cap)
        os.set_blocking(fd, True)
        try:
            data = handle.read(cap + 1)  # files that report no size (/proc) are bounded too
        except OSError as exc:
            raise spec_error(exc, p) from None
    if len(data) > cap:
        _too_large(p, cap)
    return data


def read_user_text(path: str | os.PathLike[str], cap: int = MAX_FILE_BYTES) -> str:
    """read_user_bytes, as UTF-8 text."""
    try:
        return read_user_bytes(path, cap).decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text; save it as UTF-8") from None


def _refuse_special(p: Path, mode: int) -> None:
    kind = special_kind(mode)
    if kind == "a folder":
        raise SpecError(f"{p}: is a folder (give a file)")
    if kind is not None:
        raise SpecError(f"{p}: is {kind}, not a regular file (give a file)")


def _too_large(p: Path, cap: int) -> None:
    raise SpecError(f"{p}: file larger than {cap / 1024**2:g} MiB; is this the right file?")


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one YAML mapping."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML loading that refuses a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` entries may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if duplicate:
                raise _DuplicateKey(None, None, f"duplicate key {str(key)[:60]!r} (keep one)", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str, origin: str) -> Any:
    """Parse YAML with safe loading only; syntax errors name the file and line."""
    if len(text.encode("utf-8", "replace")) > MAX_FILE_BYTES:
        raise SpecError(f"{origin}: file larger than {MAX_FILE_BYTES // 1024**2} MiB; is this the right file?")
    try:
        if _count_aliases(text) > MAX_ALIASES:
            raise SpecError(f"{origin}: more than {MAX_ALIASES} YAML aliases; write the values out instead")
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{origin}:{mark.line + 1}" if mark else origin
        kind = "" if isinstance(exc, _DuplicateKey) else "YAML syntax error: "
        raise SpecError(f"{where}: {kind}{exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:  # e.g. a control character: one line, no parser internals
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(f"{origin}: not valid YAML text: {first}") from None


def _count_aliases(text: str) -> int:
    count = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(token, yaml.AliasToken):
            count += 1
            if count > MAX_ALIASES:
                break
    return count


def load_yaml(path: str | os.PathLike[str]) -> Any:
    """Load a user YAML (or JSON, a YAML subset) file."""
    return load_yaml_text(read_user_text(path), str(path))


def loads_json(text: str, origin: str) -> Any:
    """Parse JSON text, refusing a key given twice in one object (json keeps the last)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise SpecError(f"{origin}: duplicate key {key[:60]!r} (keep one)")
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{origin}:{exc.lineno}: JSON syntax error: {exc.msg}") from None
    except RecursionError:
        raise SpecError(f"{origin}: JSON nested too deeply; flatten it") from None


def data_text(relative: str) -> str:
    """Text of a file shipped under traces/data/."""
    return resources.files("traces").joinpath("data", relative).read_text(encoding="utf-8")


def data_files(folder: str) -> list[str]:
    """Names of the files shipped in traces/data/<folder>."""
    root = resources.files("traces").joinpath("data", folder)
    return sorted(entry.name for entry in root.iterdir() if entry.is_file())
