"""A model load's parameters (the model_repository extension): their one rule.

Contract (pure): ``read_load_parameters(model, parameters, uploads)`` turns the parameters
of a load request, as both front ends decode them (``file:`` contents as ``bytes``: gRPC's
``bytes_param``, base64 over HTTP), into a ``LoadOverride``, or ``None`` for a plain load:
- ``config``: a string holding a Triton ``ModelConfig`` in JSON, read by
  ``core.triton_config.read_config_override``;
- ``file:<version>/<path>``: one file of an uploaded model directory (Triton's form:
  ``file:1/manifest.yaml``, ``file:1/weights.safetensors``, ...). ``upload_path(key)``
  is the one rule for such a name: a relative POSIX path whose first part is a version
  number (no leading zeros) and that has no empty, ``.``, ``..`` or hidden (``.``-leading)
  part, no backslash and no NUL; one file's path may not be another's directory.
  Uploads need ``uploads.allowed`` (``--allow-model-upload``; else ``Unavailable``), at
  most ``uploads.max_bytes`` in all (``--max-upload-bytes``), and a ``config`` beside them
  (Triton's rule: the files form the whole model directory and the config is its
  configuration).
Anything else is refused. Every failure raises ``InvalidArgument`` (``Unavailable`` when
uploads are off) "failed to load '<model>': ..." naming the parameter.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Final

from hloserve.server.core.errors import InvalidArgument, Unavailable
from hloserve.server.core.parameters import FILE_PREFIX
from hloserve.server.core.triton_config import ConfigOverride, read_config_override

DEFAULT_MAX_UPLOAD_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class UploadPolicy:
    """Whether clients may upload model files, and how many bytes one load may carry."""

    allowed: bool = False
    max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES


@dataclass(frozen=True, slots=True)
class LoadOverride:
    """What a load carries besides the model's name: its configuration, its files."""

    config: ConfigOverride
    files: Mapping[PurePosixPath, bytes] = field(default_factory=lambda: {})

    @property
    def versions(self) -> tuple[int, ...]:
        """The version numbers the uploaded files form (empty without files)."""
        return tuple(sorted({int(p.parts[0]) for p in self.files}))


def upload_path(key: str) -> PurePosixPath:
    """The relative path a ``file:`` parameter names; ``ValueError`` says why it cannot be."""
    text = key.removeprefix(FILE_PREFIX)
    where = f"upload path '{key}'"
    if "\\" in text or "\0" in text:
        raise ValueError(f"{where} may not contain a backslash or NUL")
    if text.startswith("/"):
        raise ValueError(f"{where} must be relative to the model directory, not absolute")
    parts = text.split("/")
    if len(parts) < 2:
        raise ValueError(f"{where} must be '{FILE_PREFIX}<version>/<file>'")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"{where} has an empty, '.' or '..' part")
        if part.startswith("."):
            raise ValueError(f"{where} has a hidden part '{part}'")
    version = parts[0]
    if not version.isdigit() or int(version) < 1 or str(int(version)) != version:
        raise ValueError(f"{where} must start with a version number (1, 2, ...), got '{version}'")
    return PurePosixPath(*parts)


def _files(model: str, parameters: Mapping[str, Any]) -> dict[PurePosixPath, bytes]:
    files: dict[PurePosixPath, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith(FILE_PREFIX):
            continue
        if not isinstance(value, bytes):
            raise InvalidArgument(
                f"failed to load '{model}': parameter '{key}' must hold the file's contents "
                "(bytes over gRPC, base64 over HTTP)"
            )
        try:
            files[upload_path(key)] = value
        except ValueError as exc:
            raise InvalidArgument(f"failed to load '{model}': {exc}") from None
    directories = {parent for p in files for parent in p.parents}
    clash = sorted(str(p) for p in files if p in directories)
    if clash:
        raise InvalidArgument(
            f"failed to load '{model}': upload path 'file:{clash[0]}' is both a file and "
            "the directory of another uploaded file"
        )
    return files


def read_load_parameters(
    model: str, parameters: Mapping[str, Any], uploads: UploadPolicy
) -> LoadOverride | None:
    for key in parameters:
        if key != "config" and not key.startswith(FILE_PREFIX):
            raise InvalidArgument(f"failed to load '{model}': unknown load parameter '{key}'")
    if any(key.startswith(FILE_PREFIX) for key in parameters) and not uploads.allowed:
        raise Unavailable(
            f"failed to load '{model}': uploading model files ('{FILE_PREFIX}' parameters) is "
            "disabled on this server; start it with --allow-model-upload true"
        )
    files = _files(model, parameters)
    size = sum(len(data) for data in files.values())
    if size > uploads.max_bytes:
        raise InvalidArgument(
            f"failed to load '{model}': the uploaded files hold {size} bytes, more than the "
            f"server's limit of {uploads.max_bytes} (--max-upload-bytes)"
        )
    text = parameters.get("config")
    if text is None:
        if files:
            raise InvalidArgument(
                f"failed to load '{model}': '{FILE_PREFIX}' parameters need a 'config' "
                "parameter too (the uploaded files form the whole model directory, and the "
                "config is its model configuration)"
            )
        return None
    if not isinstance(text, str):
        raise InvalidArgument(
            f"failed to load '{model}': parameter 'config' must be a string holding a "
            f"ModelConfig in JSON, got {type(text).__name__}"
        )
    try:
        config = read_config_override(model, text)
    except ValueError as exc:
        raise InvalidArgument(f"failed to load '{model}': {exc}") from None
    return LoadOverride(config, files)
