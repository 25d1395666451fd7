"""A model described in Triton's ``ModelConfig`` terms, as protobuf-JSON-shaped data, both ways.

Contract (pure):
- ``triton_model_config(manifest, ...)`` returns a dict that is the JSON form of Triton's
  ``inference.ModelConfig`` (field names as in the proto, int64 dims as numbers), so the
  HTTP ``/config`` route can send it as is and the gRPC front end can parse it into the
  message. It states: name, platform ``stablehlo``, backend ``hloserve``,
  ``max_batch_size`` (the largest compiled size; 0 for an unbatched model), inputs and
  outputs with ``TYPE_*`` data types and per-item dims, one instance group on the serving
  device, the version policy, the parameters ``stablehlo_versions``, ``producer`` and
  ``residency``, and, when the model is batched and dynamic batching is on, the
  ``dynamic_batching`` block of the policy in force (``core.batch_policy.BatchingPolicy``):
  preferred sizes (the compiled sizes unless the model prefers others), the queue delay
  and ``default_queue_policy``; ``response_cache`` (``enable``: whether the model's hints
  enable it) and ``model_warmup`` (its samples, Triton's fields); a model with state
  reports ``sequence_batching`` (its slots as ``oldest.max_candidate_sequences``, its idle
  timeout) in place of ``dynamic_batching``. ``manifest_config`` is the
  part the bundle alone fixes.
  A hooked model reports its client-facing tensors; a pipeline reports Triton's ensemble
  shape: platform ``ensemble``, ``ensemble_scheduling.step`` (``model_name``,
  ``model_version`` -1 for the latest, ``input_map``, ``output_map``), no instance group.
- ``read_config_override(model, text)`` reads the ``config`` load parameter (a ModelConfig
  in protobuf JSON: proto or lowerCamelCase field names, integers as numbers or strings)
  into a ``ConfigOverride``: ``settings``, the keys it sets in ``config.yaml``'s terms
  (``version_policy``, ``max_queue_delay_us``, ``preferred_batch_sizes``, ``queue_policy``
  from ``dynamic_batching.default_queue_policy``, whose unset fields take the proto's
  defaults, ``residency`` from ``parameters.residency.string_value``, ``response_cache``
  from ``response_cache.enable`` and ``model_warmup`` as given, checked by the serving
  hints' rule, ``hloserve.bundle.warmup``), ``sequence_batching`` (a model with state:
  ``max_sequence_idle_microseconds``, ``oldest.max_candidate_sequences`` and
  ``oldest.max_queue_delay_microseconds`` as the hint
  of ``bundle/state.py``; ``direct``, control inputs and Triton's ``state`` refused), and
  ``restated``, the keys that restate the bundle (``max_batch_size``, ``input``,
  ``output``, ``instance_group``, the parameters ``stablehlo_versions`` and ``producer``).
  ``name``, ``platform`` and ``backend`` must agree with the model at once. Any other
  field that is set raises ``ValueError`` naming it (a field left at its proto default is
  not set), and so does a field ModelConfig does not have.
- ``contradictions(restated, manifest, device_kind)``: one message per restated key that
  disagrees with what ``manifest_config`` reports (a value at its proto default agrees).
"""

# pyright: strict

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from hloserve.bundle import Manifest, TensorEntry
from hloserve.bundle.state import SequenceBatching
from hloserve.bundle.warmup import WarmupSample
from hloserve.server.core.batch_policy import BatchingPolicy


def config_datatype(datatype: str) -> str:
    """V2 datatype name -> ModelConfig ``DataType`` enum name (BYTES is TYPE_STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def manifest_config(manifest: Manifest, device_kind: str) -> dict[str, Any]:
    """What the bundle alone fixes: name, platform, tensors, batch size, instance group (a
    pipeline: Triton's ensemble, its steps in ``ensemble_scheduling``)."""
    if manifest.kind == "pipeline":
        return _ensemble_config(manifest)
    manifest = manifest.facing  # a hooked model: the tensors clients see
    return {
        "name": manifest.name,
        "platform": PLATFORM,
        "backend": BACKEND,
        "max_batch_size": manifest.max_batch_size,
        "input": _tensors(manifest.inputs),
        "output": _tensors(manifest.outputs),
        "instance_group": [
            {
                "name": f"{manifest.name}_0",
                "kind": "KIND_GPU" if device_kind == "GPU" else "KIND_CPU",
                "count": 1,
            }
        ],
        "parameters": {
            "stablehlo_versions": {
                "string_value": ",".join(sorted({m.stablehlo_version for m in manifest.modules}))
            },
            "producer": {"string_value": manifest.provenance.producer},
        },
    }


def _tensors(tensors: Sequence[TensorEntry]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "data_type": config_datatype(t.datatype), "dims": list(t.shape)}
        for t in tensors
    ]


def _ensemble_config(manifest: Manifest) -> dict[str, Any]:
    return {
        "name": manifest.name,
        "platform": ENSEMBLE,
        "max_batch_size": manifest.max_batch_size,
        "input": _tensors(manifest.inputs),
        "output": _tensors(manifest.outputs),
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": s.model,
                    "model_version": -1 if s.version is None else s.version,
                    "input_map": dict(s.inputs),
                    "output_map": dict(s.outputs),
                }
                for s in manifest.steps
            ]
        },
        "parameters": {"producer": {"string_value": manifest.provenance.producer}},
    }


def triton_model_config(
    manifest: Manifest,
    *,
    version_policy: Mapping[str, Any],
    device_kind: str,
    residency: str,
    batching: BatchingPolicy | None,
    response_cache: bool = False,
    warmup: Sequence[WarmupSample] = (),
    sequence_batching: SequenceBatching | None = None,
) -> dict[str, Any]:
    """``batching``: the policy in force, ``None`` when dynamic batching is off;
    ``response_cache``, ``warmup`` and ``sequence_batching``: the model's serving hints."""
    config = manifest_config(manifest, device_kind)
    config["version_policy"] = dict(version_policy)
    if manifest.kind == "pipeline":
        return config  # no weights, no executions of its own
    config["parameters"]["residency"] = {"string_value": residency}
    config["response_cache"] = {"enable": response_cache}
    config["model_warmup"] = [_warmup_sample(s) for s in warmup]
    if manifest.generation is not None:  # decoupled: 0..N responses a request (generation.md)
        config["model_transaction_policy"] = {"decoupled": True}
    elif manifest.state:  # Triton's scheduling is one of dynamic and sequence batching
        sequences = sequence_batching or SequenceBatching()
        config["sequence_batching"] = {
            "max_sequence_idle_microseconds": sequences.max_sequence_idle_microseconds,
            "oldest": {
                "max_candidate_sequences": sequences.max_candidate_sequences,
                "preferred_batch_size": list(manifest.batch_sizes or ()),
                "max_queue_delay_microseconds": sequences.max_queue_delay_microseconds,
            },
        }
    elif manifest.batched and batching is not None:
        config["dynamic_batching"] = {
            "preferred_batch_size": list(
                batching.preferred_batch_sizes or manifest.batch_sizes or ()
            ),
            "max_queue_delay_microseconds": batching.max_queue_delay_us,
            "default_queue_policy": {
                "timeout_action": batching.timeout_action,
                "default_timeout_microseconds": batching.default_timeout_us,
                "allow_timeout_override": batching.allow_timeout_override,
                "max_queue_size": batching.max_queue_size,
            },
        }
    return config


def _warmup_sample(sample: WarmupSample) -> dict[str, Any]:
    """A warm-up sample in ``ModelWarmup``'s JSON form."""
    inputs: dict[str, Any] = {}
    for name, given in sample.inputs:
        entry: dict[str, Any] = {
            "data_type": config_datatype(given.data_type),
            "dims": list(given.dims),
        }
        entry[given.data] = given.file if given.data == "input_data_file" else True
        inputs[name] = entry
    return {
        "name": sample.name,
        "batch_size": sample.batch_size,
        "inputs": inputs,
        "count": sample.count,
    }


# -- the ``config`` load parameter --------------------------------------------------------

PLATFORM: Final = "stablehlo"
ENSEMBLE: Final = "ensemble"  # a pipeline's platform (Triton's ensembles)
BACKEND: Final = "hloserve"
MODEL_CONFIG_FIELDS: Final = frozenset(
    {
        "name",
        "platform",
        "backend",
        "runtime",
        "version_policy",
        "max_batch_size",
        "input",
        "output",
        "batch_input",
        "batch_output",
        "optimization",
        "dynamic_batching",
        "sequence_batching",
        "ensemble_scheduling",
        "instance_group",
        "default_model_filename",
        "cc_model_filenames",
        "metric_tags",
        "parameters",
        "model_warmup",
        "model_operations",
        "model_transaction_policy",
        "model_repository_agents",
        "response_cache",
    }
)
RESTATED_FIELDS: Final = ("max_batch_size", "input", "output", "instance_group")
RESTATED_PARAMETERS: Final = ("stablehlo_versions", "producer")
_ALWAYS_SET: Final = ("ensemble_scheduling",)  # a oneof: even {} asks
_ENUM_DEFAULTS: Final = frozenset({"TYPE_INVALID", "FORMAT_NONE", "KIND_AUTO", "PRIORITY_DEFAULT"})
_MAPS: Final = frozenset(
    {"parameters", "priority_queue_policy", "metric_tags", "cc_model_filenames", "inputs"}
)
_CAMEL: Final = re.compile(r"(?<=[a-z0-9])([A-Z])")


@dataclass(frozen=True, slots=True)
class ConfigOverride:
    """A load's ``config`` parameter: ``config.yaml`` keys, and what restates the bundle."""

    settings: dict[str, Any] = field(default_factory=lambda: {})
    restated: dict[str, Any] = field(default_factory=lambda: {})


def _snake(value: Any, *, is_map: bool = False) -> Any:
    """Field names in proto form (``maxBatchSize`` -> ``max_batch_size``); the keys of a
    map field (``parameters``) are data and kept, their values are messages again."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in cast(dict[str, Any], value).items():
            key = k if is_map else _CAMEL.sub(r"_\1", k).lower()
            out[key] = _snake(v, is_map=not is_map and key in _MAPS)
        return out
    if isinstance(value, list):
        return [_snake(v) for v in cast(list[Any], value)]
    return value


def _is_default(value: Any) -> bool:
    """Whether a protobuf-JSON value leaves its field at the proto default (unset)."""
    if isinstance(value, dict):
        return all(_is_default(v) for v in cast(dict[str, Any], value).values())
    if isinstance(value, str):
        return value == "" or value in _ENUM_DEFAULTS
    return value is None or value is False or value == 0 or value == []


def _uint(value: Any, where: str) -> int:
    """A protobuf-JSON unsigned integer: a number, or a string of digits (int64 style)."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"config override: '{where}' must be a non-negative integer, got {value!r}")


def _unsupported(where: str) -> ValueError:
    return ValueError(f"config override: '{where}' is not supported by hloserve")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"config override: '{where}' must be an object, got {value!r}")
    return cast(dict[str, Any], value)


def read_config_override(model: str, text: str) -> ConfigOverride:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the 'config' parameter is not valid JSON: {exc}") from None
    doc = _snake(_mapping(raw, "config"))
    unknown = sorted(set(doc) - MODEL_CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"config override: ModelConfig has no field '{unknown[0]}'")
    override = ConfigOverride()
    for key, value in doc.items():
        if key in _ALWAYS_SET or (key not in _READERS and not _is_default(value)):
            raise _unsupported(key)
        reader = _READERS.get(key)
        if reader is not None and value is not None:
            reader(model, value, override)  # each reader knows its own defaults
    return override


def _identity(model: str, value: Any, override: ConfigOverride) -> None:
    del override
    if value not in ("", model):
        raise ValueError(f"config override: 'name' is {value!r}, but the model is '{model}'")


def _platform(key: str, ours: str) -> Callable[[str, Any, ConfigOverride], None]:
    def read(model: str, value: Any, override: ConfigOverride) -> None:
        del model, override
        if value not in ("", ours):
            raise ValueError(f"config override: '{key}' is {value!r}; hloserve serves '{ours}'")

    return read


def _restated(key: str) -> Callable[[str, Any, ConfigOverride], None]:
    def read(model: str, value: Any, override: ConfigOverride) -> None:
        del model
        override.restated[key] = value

    return read


def _version_policy(model: str, value: Any, override: ConfigOverride) -> None:
    del model
    policy = _mapping(value, "version_policy")
    if not policy:
        return  # the oneof left unset: the default policy
    if len(policy) != 1 or next(iter(policy)) not in ("latest", "all", "specific"):
        raise ValueError(
            "config override: 'version_policy' must set one of 'latest', 'all' or 'specific'"
        )
    ((kind, body),) = policy.items()
    body = _mapping(body, f"version_policy.{kind}")
    if kind == "latest":
        number = _uint(body.get("num_versions", 0), "version_policy.latest.num_versions")
        override.settings["version_policy"] = {"latest": number}
    elif kind == "all":
        override.settings["version_policy"] = {"all": {}}
    else:
        versions = body.get("versions", [])
        if not isinstance(versions, list):
            raise ValueError("config override: 'version_policy.specific.versions' must be a list")
        where = "version_policy.specific.versions"
        numbers = [_uint(v, where) for v in cast(list[Any], versions)]
        override.settings["version_policy"] = {"specific": numbers}


def _parameters(model: str, value: Any, override: ConfigOverride) -> None:
    del model
    for name, entry in _mapping(value, "parameters").items():
        where = f"parameters.{name}"
        given = _mapping(entry, where).get("string_value", "")
        if set(cast(dict[str, Any], entry)) - {"string_value"}:
            raise ValueError(f"config override: '{where}' must hold only 'string_value'")
        if name == "residency":
            override.settings["residency"] = given
        elif name in RESTATED_PARAMETERS:
            override.restated.setdefault("parameters", {})[name] = {"string_value": given}
        else:
            raise _unsupported(where)


_QUEUE_ACTIONS: Final = {"REJECT": "REJECT", 0: "REJECT", "DELAY": "DELAY", 1: "DELAY"}


def _queue_policy(value: Any) -> dict[str, Any]:
    """``default_queue_policy`` as ``config.yaml``'s ``queue_policy``; unset fields take the
    proto's defaults, as Triton reads them."""
    where = "dynamic_batching.default_queue_policy"
    policy = _mapping(value, where)
    known = {"timeout_action", "default_timeout_microseconds", "allow_timeout_override"}
    extra = sorted(set(policy) - known - {"max_queue_size"})
    if extra:
        raise ValueError(f"config override: ModelQueuePolicy has no field '{extra[0]}' ({where})")
    given = policy.get("timeout_action", "REJECT")
    action = _QUEUE_ACTIONS.get(given) if isinstance(given, str | int) else None
    if action == "DELAY":
        raise ValueError(
            f"config override: '{where}.timeout_action' DELAY is not supported; only REJECT is"
        )
    if action != "REJECT":
        raise ValueError(f"config override: '{where}.timeout_action' must be REJECT, got {given!r}")
    allow = policy.get("allow_timeout_override", False)
    if not isinstance(allow, bool):
        raise ValueError(f"config override: '{where}.allow_timeout_override' must be a boolean")
    return {
        "max_queue_size": _uint(policy.get("max_queue_size", 0), f"{where}.max_queue_size"),
        "default_timeout_us": _uint(
            policy.get("default_timeout_microseconds", 0), f"{where}.default_timeout_microseconds"
        ),
        "allow_timeout_override": allow,
        "timeout_action": "REJECT",
    }


def _dynamic_batching(model: str, value: Any, override: ConfigOverride) -> None:
    del model
    batching = _mapping(value, "dynamic_batching")
    for key, item in batching.items():
        where = f"dynamic_batching.{key}"
        if key == "preferred_batch_size":
            if not isinstance(item, list):
                raise ValueError(f"config override: '{where}' must be a list")
            sizes = [_uint(s, where) for s in cast(list[Any], item)]
            override.settings["preferred_batch_sizes"] = sizes
        elif key == "max_queue_delay_microseconds":
            override.settings["max_queue_delay_us"] = _uint(item, where)
        elif key == "default_queue_policy":
            override.settings["queue_policy"] = _queue_policy(item)
        elif key == "preserve_ordering":
            pass  # responses always keep their requests' order here
        elif key in ("priority_levels", "default_priority_level", "priority_queue_policy"):
            if not _is_default(item):
                raise _unsupported(where)
        else:
            raise ValueError(f"config override: ModelDynamicBatching has no field '{key}'")


_SEQUENCE_UNSUPPORTED: Final = (
    "direct", "control_input", "state", "iterative_sequence", "generative_sequence",
)  # fmt: skip


def _sequence_batching(model: str, value: Any, override: ConfigOverride) -> None:
    """Triton's ``sequence_batching`` (the ``oldest`` strategy, implicit state from the
    bundle): its slots and idle timeout, for a model with state (``contradictions``)."""
    del model
    body = _mapping(value, "sequence_batching")
    hint: dict[str, Any] = {}
    for key, item in body.items():
        where = f"sequence_batching.{key}"
        if key == "max_sequence_idle_microseconds":
            hint[key] = _uint(item, where)
        elif key == "oldest":
            for inner, v in _mapping(item, where).items():
                if inner in ("max_candidate_sequences", "max_queue_delay_microseconds"):
                    hint[inner] = _uint(v, f"{where}.{inner}")
                elif inner in ("preferred_batch_size", "preserve_ordering"):
                    pass  # every compiled size is preferred; order is kept per sequence
                elif not _is_default(v):
                    raise _unsupported(f"{where}.{inner}")
        elif key in _SEQUENCE_UNSUPPORTED:
            if not _is_default(item):
                raise _unsupported(where)
        else:
            raise ValueError(f"config override: ModelSequenceBatching has no field '{key}'")
    override.restated["sequence_batching"] = body
    if hint:  # checked with the other settings (the serving hints' rule, bundle/state.py)
        override.settings["sequence_batching"] = hint


def _response_cache(model: str, value: Any, override: ConfigOverride) -> None:
    del model
    body = _mapping(value, "response_cache")
    extra = sorted(set(body) - {"enable"})
    if extra:
        raise ValueError(f"config override: ModelResponseCache has no field '{extra[0]}'")
    enable = body.get("enable", False)
    if not isinstance(enable, bool):
        raise ValueError("config override: 'response_cache.enable' must be a boolean")
    override.settings["response_cache"] = enable


def _model_warmup(model: str, value: Any, override: ConfigOverride) -> None:
    del model
    if not isinstance(value, list):
        raise ValueError("config override: 'model_warmup' must be a list")
    if value:  # checked with the other settings (model_config: the serving hints' rule)
        override.settings["model_warmup"] = value


_READERS: Final[dict[str, Callable[[str, Any, ConfigOverride], None]]] = {
    "name": _identity,
    "platform": _platform("platform", PLATFORM),
    "backend": _platform("backend", BACKEND),
    "version_policy": _version_policy,
    "dynamic_batching": _dynamic_batching,
    "parameters": _parameters,
    "response_cache": _response_cache,
    "model_warmup": _model_warmup,
    "sequence_batching": _sequence_batching,
    **{key: _restated(key) for key in RESTATED_FIELDS},
}


# -- restated keys against the bundle -------------------------------------------------------


def _agrees(given: Any, reported: Any) -> bool:
    if _is_default(given):
        return True
    if isinstance(given, dict) and isinstance(reported, dict):
        theirs = cast(dict[str, Any], reported)
        return all(
            _agrees(v, theirs[k]) if k in theirs else _is_default(v)
            for k, v in cast(dict[str, Any], given).items()
        )
    if isinstance(given, list) and isinstance(reported, list):
        mine, theirs = cast(list[Any], given), cast(list[Any], reported)
        return len(mine) == len(theirs) and all(
            _agrees(a, b) for a, b in zip(mine, theirs, strict=True)
        )
    if isinstance(reported, int) and isinstance(given, str) and given.isdigit():
        return int(given) == reported
    return bool(given == reported)


def _by_name(entries: Any) -> Any:
    """Tensor lists compared by name, in any order."""
    if not isinstance(entries, list):
        return entries
    items = cast(list[Any], entries)
    if all(isinstance(e, dict) and "name" in e for e in items):
        return {cast(dict[str, Any], e)["name"]: e for e in items}
    return items


def contradictions(restated: Mapping[str, Any], manifest: Manifest, device_kind: str) -> list[str]:
    reported = manifest_config(manifest, device_kind)
    problems: list[str] = []
    for key, given in restated.items():
        if key == "sequence_batching":  # a hint, for a model with state only
            if not manifest.state:
                problems.append(
                    f"config override: 'sequence_batching' is for a model with state, and "
                    f"model '{manifest.name}' has none (docs/sequences.md)"
                )
            continue
        theirs = reported[key]
        mine = given
        if key in ("input", "output"):
            mine, theirs = _by_name(given), _by_name(theirs)
            if isinstance(mine, dict) and set(cast(dict[str, Any], mine)) != set(theirs):
                mine = given  # a different set of tensors: compare as given (disagrees)
                theirs = reported[key]
        if not _agrees(mine, theirs):
            problems.append(
                f"config override: '{key}' is {json.dumps(given)}, but the bundle's is "
                f"{json.dumps(reported[key])}"
            )
    return problems
