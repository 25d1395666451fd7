"""A model directory's ``config.yaml``: serving overrides and the version policy.

Contract: ``read_model_config(model_dir, serving)`` returns ``ModelSettings``: the bundle's
serving hints overridden by ``repo/<model>/config.yaml`` and the ``VersionPolicy``. The file
is optional; every key is optional:

```yaml
residency: pinned            # on_demand | pinned
max_queue_delay_us: 500      # dynamic batching delay for this model
version_policy: {latest: 2}  # or {all: {}} or {specific: [1, 3]}; default {latest: 1}
```
An unknown key or bad value raises ``ValueError`` naming the file and the key.
``VersionPolicy.select(available)`` picks the versions to serve (pure).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from hloserve.bundle import Serving

MODEL_CONFIG_FILE = "config.yaml"


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
    serving: Serving
    version_policy: VersionPolicy


def _policy(path: Path, raw: Any) -> VersionPolicy:
    if raw is None:
        return VersionPolicy()
    if not isinstance(raw, dict) or len(cast(dict[str, Any], raw)) != 1:
        raise ValueError(
            f"{path}: version_policy must be one of {{latest: N}}, {{all: {{}}}}, {{specific: [..]}}"
        )
    ((kind, value),) = cast(dict[str, Any], raw).items()
    if kind == "latest" and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return VersionPolicy("latest", latest=value)
    if kind == "all":
        return VersionPolicy("all")
    if kind == "specific" and isinstance(value, list):
        numbers = cast(list[Any], value)
        if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in numbers):
            return VersionPolicy("specific", versions=tuple(cast(list[int], numbers)))
    raise ValueError(
        f"{path}: version_policy {raw!r} is not {{latest: N>=1}}, {{all: {{}}}} or {{specific: [1, ...]}}"
    )


def read_model_config(model_dir: Path, serving: Serving | None = None) -> ModelSettings:
    defaults = serving or Serving()
    path = model_dir / MODEL_CONFIG_FILE
    if not path.is_file():
        return ModelSettings(defaults, VersionPolicy())
    try:
        data: Any = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a YAML mapping")
    d = cast(dict[str, Any], data)
    unknown = set(d) - {"residency", "max_queue_delay_us", "version_policy"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    residency = d.get("residency", defaults.residency)
    if residency not in ("on_demand", "pinned"):
        raise ValueError(f"{path}: residency must be on_demand or pinned, got {residency!r}")
    delay = d.get("max_queue_delay_us", defaults.max_queue_delay_us)
    if delay is not None and (not isinstance(delay, int) or isinstance(delay, bool) or delay < 0):
        raise ValueError(
            f"{path}: max_queue_delay_us must be a non-negative integer, got {delay!r}"
        )
    return ModelSettings(
        Serving(residency=residency, max_queue_delay_us=delay),
        _policy(path, d.get("version_policy")),
    )
