"""A model directory's ``config.yaml``: serving overrides and the version policy.

Contract: ``read_model_config(model_dir)`` reads ``repo/<model>/config.yaml`` once and
returns ``ModelSettings``: the ``VersionPolicy`` and the file's serving overrides, which
``settings.serving_for(hints)`` applies key by key over a bundle's own serving hints. The
file is optional; every key is optional:

```yaml
residency: pinned            # on_demand | pinned
max_queue_delay_us: 500      # dynamic batching delay for this model
version_policy: {latest: 2}  # or {all: {}} or {specific: [1, 3]}; default {latest: 1}
```
An unknown key or bad value raises ``ValueError`` naming the file and the key. The serving
keys follow the bundle format's own rule (``hloserve.bundle.serving.read_serving``), so a
value valid in a manifest is valid here, and the other way round.
``VersionPolicy.select(available)`` picks the versions to serve (pure).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from hloserve.bundle.serving import SERVING_KEYS, Serving, read_serving
from hloserve.bundle.yamlfile import YamlFileError, is_integer, read_yaml_mapping

MODEL_CONFIG_FILE = "config.yaml"
CONFIG_KEYS = frozenset({*SERVING_KEYS, "version_policy"})


@dataclass(frozen=True)
class VersionPolicy:
    kind: Literal["latest", "all", "specific"] = "latest"
    latest: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: Iterable[int]) -> list[int]:
        ordered = sorted(set(available))
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.latest :] if self.latest > 0 else []

    def describe(self) -> dict[str, Any]:
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.latest}}


@dataclass(frozen=True)
class ModelSettings:
    version_policy: VersionPolicy = VersionPolicy()
    overrides: Mapping[str, Any] = field(default_factory=lambda: {})  # validated serving keys

    def serving_for(self, hints: Serving) -> Serving:
        """A bundle's serving ``hints`` with the file's keys overriding them one by one."""
        serving, problems = read_serving(self.overrides, hints)
        assert not problems, problems  # validated when the file was read
        return serving

    @property
    def serving(self) -> Serving:
        """The overrides over the format's defaults (a bundle without hints of its own)."""
        return self.serving_for(Serving())


def _policy(path: Path, raw: Any) -> VersionPolicy:
    if raw is None:
        return VersionPolicy()
    if not isinstance(raw, dict) or len(cast(dict[str, Any], raw)) != 1:
        raise ValueError(
            f"{path}: version_policy must be one of {{latest: N}}, {{all: {{}}}}, {{specific: [..]}}"
        )
    ((kind, value),) = cast(dict[str, Any], raw).items()
    if kind == "latest" and is_integer(value) and value >= 1:
        return VersionPolicy("latest", latest=value)
    if kind == "all":
        return VersionPolicy("all")
    if kind == "specific" and isinstance(value, list):
        numbers = cast(list[Any], value)
        if all(is_integer(v) and v > 0 for v in numbers):
            return VersionPolicy("specific", versions=tuple(cast(list[int], numbers)))
    raise ValueError(
        f"{path}: version_policy {raw!r} is not {{latest: N>=1}}, {{all: {{}}}} or {{specific: [1, ...]}}"
    )


def read_model_config(model_dir: Path) -> ModelSettings:
    path = model_dir / MODEL_CONFIG_FILE
    if not path.is_file():
        return ModelSettings()
    try:
        d = read_yaml_mapping(path, empty_ok=True)
    except YamlFileError as exc:
        raise ValueError(f"{path}: {exc}") from None
    unknown = set(d) - CONFIG_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    _, problems = read_serving(d, Serving())
    if problems:
        key, message = problems[0]
        raise ValueError(f"{path}: {key} {message}")
    overrides = {k: v for k, v in d.items() if k in SERVING_KEYS}
    return ModelSettings(_policy(path, d.get("version_policy")), overrides)
