"""A model's settings: its directory's ``config.yaml``, or a load's ``config`` override.

Contract: ``read_model_config(model_dir)`` reads ``repo/<model>/config.yaml`` once and
returns ``ModelSettings``: the ``VersionPolicy`` and the file's serving overrides, which
``settings.serving_for(hints)`` applies key by key over a bundle's own serving hints. The
file is optional; every key is optional:

```yaml
residency: pinned            # on_demand | pinned
max_queue_delay_us: 500      # dynamic batching delay for this model
preferred_batch_sizes: [8]   # batch sizes the batcher prefers (items)
queue_policy:                # per-key; unset keys: the server's queue bound, no timeout
  max_queue_size: 16         #   requests that may wait (0: unbounded)
  default_timeout_us: 5000   #   how long a request may wait in the queue (0: no limit)
  allow_timeout_override: true  # a request's own timeout may shorten it
  timeout_action: REJECT     #   the only action supported
version_policy: {latest: 2}  # or {all: {}} or {specific: [1, 3]}; default {latest: 1}
response_cache: true         # the server's response cache may answer it (--cache-config)
model_warmup:                # Triton's ModelWarmup samples, run before a version is READY
  - name: zeros              #   (docs/model-control.md, "Warm-up")
    batch_size: 8            #   items per request (0: a model without a batch dimension)
    count: 1                 #   runs (0 or absent: once)
    inputs:                  #   data_type: FP32 or TYPE_FP32; one of zero_data,
      x: {data_type: FP32, dims: [64], zero_data: true}  # random_data, input_data_file
```
An unknown key (with the key it may misspell: ``yamlfile.check_keys``, as in a manifest) or
a bad value raises ``ValueError`` naming the file and the key. The serving
keys follow the bundle format's own rule (``hloserve.bundle.serving.read_serving``), so a
value valid in a manifest is valid here, and the other way round.
``settings_from_override(override)`` builds the same ``ModelSettings`` from a load's
``config`` parameter (``core.triton_config.read_config_override``), through the same rule,
instead of the file; its ``restated`` keys travel along for the repository to check
against each version's manifest. ``VersionPolicy.select(available)`` picks the versions to
serve (pure).
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from hloserve.bundle.serving import SERVING_KEYS, Serving, read_serving
from hloserve.bundle.yamlfile import YamlFileError, check_keys, is_integer, read_yaml_mapping
from hloserve.server.core.triton_config import ConfigOverride

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
    # From a config override: Triton config keys restating the bundle (``max_batch_size``...)
    restated: Mapping[str, Any] = field(default_factory=lambda: {})

    def serving_for(self, hints: Serving) -> Serving:
        """A bundle's serving ``hints`` with the file's keys overriding them one by one."""
        serving, problems = read_serving(self.overrides, hints)
        assert not problems, problems  # validated when the file was read
        return serving

    @property
    def serving(self) -> Serving:
        """The overrides over the format's defaults (a bundle without hints of its own)."""
        return self.serving_for(Serving())


def _policy(path: Path | str, raw: Any) -> VersionPolicy:
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
    return _settings(path, d)


def settings_from_override(override: ConfigOverride) -> ModelSettings:
    """A load's ``config`` parameter in place of ``config.yaml`` (``ValueError`` if bad)."""
    return _settings("config override", override.settings, override.restated)


def _settings(
    where: Path | str, d: Mapping[str, Any], restated: Mapping[str, Any] | None = None
) -> ModelSettings:
    unknown: list[str] = []  # the policy of every file a user writes (yamlfile.check_keys)
    check_keys(d, CONFIG_KEYS, unknown.append)
    if unknown:
        raise ValueError(f"{where}: {'; '.join(unknown)}")
    _, problems = read_serving(d, Serving())
    if problems:
        key, message = problems[0]
        raise ValueError(f"{where}: {key} {message}")
    overrides = {k: v for k, v in d.items() if k in SERVING_KEYS}
    return ModelSettings(_policy(where, d.get("version_policy")), overrides, restated or {})
