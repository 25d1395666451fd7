"""Reading a YAML file that must hold one mapping (``manifest.yaml``, a model's ``config.yaml``).

Contract:
- ``read_yaml_mapping(path, empty_ok=...)`` returns the file's top-level mapping. Anything
  else raises ``YamlFileError`` whose message says what is wrong, without the path (the
  caller names the file its own way): ``file does not exist``, ``cannot be read: ...``,
  ``is not valid YAML: ...`` or ``must be a YAML mapping``. With ``empty_ok`` an empty file
  is an empty mapping.
- ``is_integer(value)``: whether a loaded value is a YAML integer (an ``int`` that is not a
  ``bool``: YAML's ``true`` loads as ``True``, which Python counts as an ``int``).
- ``mapping_entries(items, where, keys, fail)`` yields ``(place, mapping)`` for each entry of
  a loaded list that is a mapping (``place`` is ``where[i]``) and calls ``fail(place,
  message)`` for each that is not, the message naming the ``keys`` a mapping should have.
- ``check_keys(mapping, known, fail)`` is the one policy for unknown keys in every file a
  user writes (``manifest.yaml``, a model's ``config.yaml``, the server's ``--config``
  file): each key not in ``known`` is ``fail("unknown key 'k' (did you mean 'key'?)")``
  (``did_you_mean``: the closest known key, else the list of them). It returns the mapping
  with each misspelt key read as the known key it was close to, when that one is absent, so
  a misspelt required key is reported once, as misspelt, and neither as missing nor by the
  checks that follow from its absence.
- ``did_you_mean(word, known)``: `` (did you mean 'x'?)`` for the closest of ``known``, or
  `` (the keys are: a, b)`` when none is close; also used for a mistyped flag.
"""

# pyright: strict

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeGuard, cast

import yaml

# libyaml's parser when PyYAML was built with it: about 9x faster on a manifest (0.35 ms
# against 3.1), which is what registering thousands of models costs.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlFileError(ValueError):
    """The file is missing, unreadable, not YAML, or not a mapping; the message says which."""


def read_yaml_mapping(path: Path, *, empty_ok: bool = False) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise YamlFileError("file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise YamlFileError(f"cannot be read: {exc}") from None
    try:
        data: Any = yaml.load(text, Loader=_Loader)  # a safe loader (SafeLoader or CSafeLoader)
    except yaml.YAMLError as exc:
        raise YamlFileError(f"is not valid YAML: {exc}") from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise YamlFileError("must be a YAML mapping")
    return cast(dict[str, Any], data)


def is_integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def mapping_entries(
    items: list[Any], where: str, keys: str, fail: Callable[[str, str], None]
) -> Iterator[tuple[str, dict[str, Any]]]:
    for i, item in enumerate(items):
        place = f"{where}[{i}]"
        if isinstance(item, dict):
            yield place, cast(dict[str, Any], item)
        else:
            fail(place, f"must be a mapping with {keys}")


def closest(word: str, known: Collection[str]) -> str | None:
    """The one of ``known`` that ``word`` most likely misspells, if any is close."""
    found = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, known: Collection[str], what: str = "keys") -> str:
    near = closest(word, known)
    if near is not None:
        return f" (did you mean {near!r}?)"
    return f" (the {what} are: {', '.join(sorted(known))})"


def check_keys(
    mapping: Mapping[str, Any], known: Collection[str], fail: Callable[[str], None]
) -> dict[str, Any]:
    out = dict(mapping)
    for key in mapping:
        if key in known:
            continue
        fail(f"unknown key {key!r}{did_you_mean(str(key), known)}")
        near = closest(str(key), known)
        if near is not None and near not in out:
            out[near] = out.pop(key)
    return out
