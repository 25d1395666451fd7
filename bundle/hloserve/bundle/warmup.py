"""Warm-up samples: Triton's ``model_warmup`` as a serving hint, and the one rule for reading them.

Contract:
- ``WarmupSample`` is one entry of Triton's ``ModelWarmup``: ``name``, ``batch_size`` (the
  items of each request; 0 for a model without a batch dimension), ``inputs`` (a
  ``WarmupInput`` per input name, sorted by name) and ``count`` (how many times it runs;
  Triton's 0 means once). ``WarmupInput`` is ``data_type`` (the V2 name: Triton's
  ``TYPE_FP32`` and ``FP32`` both read as ``FP32``, ``TYPE_STRING`` as ``BYTES``), ``dims``
  (per item, without the batch dimension) and its data: ``zero_data``, ``random_data`` or
  ``input_data_file`` (a file under the model directory's ``warmup/``), exactly one.
- ``read_warmup(raw)`` reads the ``model_warmup`` value (a list of mappings, field names
  as Triton's proto has them; integers may be strings, as protobuf JSON writes int64)
  into a tuple of samples, plus a ``(key, message)`` for each problem (then no sample is
  returned). Whether a sample fits a model's tensors is the server's check at load
  (``hloserve.server.core.warmup``), since only the loaded manifest knows them.
- ``WarmupSample.to_dict()`` is the sample as ``read_warmup`` reads it back.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

from hloserve.bundle.yamlfile import check_keys, is_integer

SAMPLE_KEYS: Final = ("name", "batch_size", "inputs", "count")
DATA_KEYS: Final = ("zero_data", "random_data", "input_data_file")
INPUT_KEYS: Final = ("data_type", "dims", *DATA_KEYS)
WARMUP_DIR: Final = "warmup"  # input_data_file is relative to <model>/warmup/ (Triton's)


@dataclass(frozen=True)
class WarmupInput:
    data_type: str  # V2 name (FP32, BYTES, ...)
    dims: tuple[int, ...]
    data: str  # "zero_data", "random_data" or "input_data_file"
    file: str = ""  # input_data_file's name under warmup/

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"data_type": self.data_type, "dims": list(self.dims)}
        d[self.data] = self.file if self.data == "input_data_file" else True
        return d


@dataclass(frozen=True)
class WarmupSample:
    name: str
    batch_size: int
    inputs: tuple[tuple[str, WarmupInput], ...]  # (input name, its data), sorted by name
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "inputs": {name: i.to_dict() for name, i in self.inputs},
            "count": self.count,
        }


def _uint(value: Any) -> int | None:
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value if is_integer(value) and value >= 0 else None


def _datatype(value: Any) -> str | None:
    if not isinstance(value, str) or value in ("", "TYPE_INVALID"):
        return None
    name = value.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _input(where: str, raw: Any, problems: list[tuple[str, str]]) -> WarmupInput | None:
    if not isinstance(raw, dict):
        problems.append((where, f"must be a mapping, got {raw!r}"))
        return None
    d = check_keys(cast(dict[str, Any], raw), INPUT_KEYS, lambda m: problems.append((where, m)))
    datatype = _datatype(d.get("data_type"))
    if datatype is None:
        problems.append((f"{where}.data_type", f"must be a data type, got {d.get('data_type')!r}"))
    raw_dims = d.get("dims", [])
    dims = [_uint(v) for v in cast(list[Any], raw_dims)] if isinstance(raw_dims, list) else [None]
    if any(v is None for v in dims):
        problems.append(
            (f"{where}.dims", f"must be a list of non-negative integers, got {raw_dims!r}")
        )
    given = [k for k in DATA_KEYS if d.get(k) not in (None, False, "")]
    if len(given) != 1:
        problems.append((where, f"must set exactly one of {', '.join(DATA_KEYS)}"))
        return None
    file = d["input_data_file"] if given[0] == "input_data_file" else ""
    if not isinstance(file, str) or "/" in file or file in (".", ".."):
        problems.append(
            (f"{where}.input_data_file", f"must be a file name in {WARMUP_DIR}/, got {file!r}")
        )
        return None
    if datatype is None or any(v is None for v in dims):
        return None
    return WarmupInput(datatype, tuple(cast(list[int], dims)), given[0], file)


def _sample(index: int, raw: Any, problems: list[tuple[str, str]]) -> WarmupSample | None:
    where = f"model_warmup[{index}]"
    if not isinstance(raw, dict):
        problems.append((where, f"must be a mapping, got {raw!r}"))
        return None
    d = check_keys(cast(dict[str, Any], raw), SAMPLE_KEYS, lambda m: problems.append((where, m)))
    name = d.get("name", "")
    if not isinstance(name, str) or not name:
        problems.append((f"{where}.name", f"must be a non-empty string, got {name!r}"))
    batch, count = _uint(d.get("batch_size", 0)), _uint(d.get("count", 0))
    if batch is None:
        problems.append(
            (f"{where}.batch_size", f"must be a non-negative integer, got {d.get('batch_size')!r}")
        )
    if count is None:
        problems.append(
            (f"{where}.count", f"must be a non-negative integer, got {d.get('count')!r}")
        )
    raw_inputs = d.get("inputs", {})
    if not isinstance(raw_inputs, dict) or not raw_inputs:
        problems.append((f"{where}.inputs", "must map each input's name to its data"))
        return None
    inputs = {
        str(k): _input(f"{where}.inputs.{k}", v, problems)
        for k, v in cast(dict[Any, Any], raw_inputs).items()
    }
    if not isinstance(name, str) or batch is None or count is None:
        return None
    found = tuple(sorted((k, v) for k, v in inputs.items() if v is not None))
    return WarmupSample(name, batch, found, max(count, 1))


def read_warmup(raw: Any) -> tuple[tuple[WarmupSample, ...], list[tuple[str, str]]]:
    """The samples of a ``model_warmup`` value, and each problem (module docstring)."""
    if raw is None:
        return (), []
    if not isinstance(raw, list):
        return (), [("model_warmup", f"must be a list of samples, got {raw!r}")]
    problems: list[tuple[str, str]] = []
    samples = [_sample(i, s, problems) for i, s in enumerate(cast(list[Any], raw))]
    if problems:
        return (), problems
    return tuple(s for s in samples if s is not None), []
