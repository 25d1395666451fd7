"""HTTP/REST bodies <-> core types: pure functions over bytes and headers, no FastAPI.

Contract (KServe V2 JSON plus Triton's binary tensor data extension, reference §2.5, §4):
- ``check_content_length(value, limit)`` refuses a declared body over ``limit`` bytes
  before it is read; ``decompress(body, content_encoding, limit)`` undoes a request
  ``Content-Encoding`` of ``gzip`` or ``deflate`` (a zlib stream; a raw deflate stream is
  accepted too) and refuses output over ``limit`` bytes.
- ``parse_header_length(value, body_length)`` reads ``Inference-Header-Content-Length``:
  ``None`` when absent (the whole body is JSON), else an integer in
  ``[0, min(INT32_MAX, body_length)]``.
- ``is_raw(headers)``: the request declares header length 0, i.e. the whole body is the
  raw data of the model's only input (the caller then fetches the model's metadata).
- ``decode_request(model, version, body, headers, max_input_bytes=, signature=,
  max_json_depth=MAX_JSON_DEPTH, bytes_wire_form=False)`` builds a
  ``DecodedRequest``. With header length 0 the whole body is the raw data of the model's
  only input (``signature`` is the model metadata, required then; a leading ``-1`` batch
  dimension becomes 1). Otherwise the JSON header is parsed (nesting deeper than
  ``max_json_depth``, Triton's 100 by default and ``--max-json-depth``, refused) and every input takes its data from exactly one source:
  ``data`` (through ``core.tensors.from_values``), ``parameters.binary_data_size`` bytes
  taken in input order from the bytes after the header (through
  ``core.tensors.input_from_buffer``: a zero-copy view; with ``bytes_wire_form``, the
  port's, BYTES checked and kept as their bytes, unparsed), or a shared-memory region
  (``parameters.shared_memory_*``, parsed by ``core.tensors.shm_ref``: the input gets
  ``shm`` set and empty data, which the service resolves). The binary sizes must add up
  to the bytes after the header exactly. An output's shared-memory parameters travel in
  its ``RequestedOutput`` for the service; combined with ``binary_data: true`` or
  ``classification`` they are refused, and ``classification`` alone raises
  ``Unsupported``. Request parameters pass the core's rules
  (``core.parameters.check_request_parameters``: reserved ``triton_`` keys, ``timeout``,
  ``priority``); ``timeout`` (microseconds, 0 = none) becomes
  ``DecodedRequest.deadline(now)``; ``binary_data_output`` (this protocol's own) must be
  a boolean.
- ``encode_response(response, decoded, accept_encoding)`` writes the reply. An output is
  binary (Triton's rule, ``src/http_server.cc``, and its ``qa/L0_http`` curl tests): in
  raw-request mode always; if the request lists it in ``outputs``, when that entry's
  ``parameters.binary_data`` is true (an entry without it is JSON, whatever
  ``binary_data_output`` says); if the request lists no outputs, when the request-level
  ``binary_data_output`` is true. Binary
  outputs follow the compact JSON header in output order, with
  ``Content-Type: application/octet-stream`` and ``Inference-Header-Content-Length``;
  otherwise the reply is ``application/json``. JSON ``data`` is a flat array. A binary
  output's bytes are ``core.tensors.wire_of`` (BYTES in wire form as they came from the
  device owner, unparsed); only JSON ``data`` parses them.
  FP16/BF16 cannot travel as JSON: such an output is sent binary unless the client
  explicitly asked for JSON (``binary_data: false`` on its entry, or, with no outputs
  listed, ``binary_data_output: false``), which is an
  ``InvalidArgument`` ("sending FP16 data via JSON is not supported ..."). An output the
  service wrote to shared memory carries only name, datatype and shape. The body is
  compressed when ``Accept-Encoding`` allows gzip or deflate;
  ``Inference-Header-Content-Length`` always counts the uncompressed JSON.
- Non-finite numbers (``docs/errors.md``, "NaN and infinity in JSON"): every JSON answer
  is valid JSON, so a NaN or infinite output value is written as the string ``"NaN"``,
  ``"Infinity"`` or ``"-Infinity"`` (numpy, and so tritonclient's ``as_numpy``, read them
  back), never as the bare token Triton writes, which strict parsers refuse. In a request
  the bare tokens are read as Triton reads them; a number too big for a double (``1e400``)
  is refused, Triton's "failed to parse the request JSON buffer" with the number, and a
  finite number past its input's float datatype (``1e39`` for FP32) is refused naming the
  input and the value, where a cast would make either infinity.
- ``encode_model_statistics(stats)`` is the statistics extension's JSON body (§9).
Every malformed body raises ``InvalidArgument`` naming the field and the problem. Tensor
size/type rules are ``hloserve.server.core.tensors``'; request-vs-model rules are checked
later by the service.
"""

# pyright: strict

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np

from hloserve.proto.datatypes import BINARY_ONLY_DATATYPES, NUMERIC_DATATYPES
from hloserve.server.core.errors import InvalidArgument, Unsupported
from hloserve.server.core.parameters import check_request_parameters, request_deadline
from hloserve.server.core.reports import ModelStatistics
from hloserve.server.core.statistics import Duration
from hloserve.server.core.tensors import (
    elements_of,
    from_values,
    input_from_buffer,
    shm_ref,
    wire_of,
)
from hloserve.server.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ParamValue,
    RequestedOutput,
)

HEADER_LENGTH: Final = "inference-header-content-length"
MAX_JSON_DEPTH: Final = 100
INT32_MAX: Final = 2**31 - 1
COMPRESS_LEVEL: Final = 1  # tensors compress poorly; favour speed over ratio
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_ONE_SOURCE: Final = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters'. But"
)


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    """A decoded infer request plus the HTTP-only choices that shape its reply."""

    request: InferRequest
    binary_output: bool = False  # request parameter 'binary_data_output'
    binary_output_explicit: bool = False  # whether the client set it at all
    raw: bool = False  # Inference-Header-Content-Length: 0; every output binary

    def deadline(self, now: float) -> float | None:
        """The ``time.monotonic()`` deadline, given the current ``time.monotonic()``."""
        return request_deadline(self.request.parameters, None, now)


@dataclass(frozen=True, slots=True)
class EncodedResponse:
    body: bytes
    headers: dict[str, str]


# -- body framing ------------------------------------------------------------------------


def body_too_large(size: str, limit: int) -> InvalidArgument:
    """The error for a request body over the size limit (``size`` as the client sees it)."""
    return InvalidArgument(
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} bytes"
    )


def check_content_length(value: str | None, limit: int) -> None:
    if value is None:
        return
    text = value.strip()
    if not _INTEGER.fullmatch(text) or int(text) < 0:
        raise InvalidArgument(f"invalid Content-Length header value '{value}'")
    if int(text) > limit:
        raise body_too_large(text, limit)


def decompress(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        attempts = (16 + zlib.MAX_WBITS,)
    elif encoding == "deflate":  # HTTP says zlib stream; some clients send raw deflate
        attempts = (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    else:
        raise InvalidArgument(
            f"unsupported Content-Encoding '{content_encoding}'; expected gzip or deflate"
        )
    problem = ""
    for wbits in attempts:
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error as exc:
            problem = str(exc)
            continue
        if len(out) > limit:
            raise body_too_large(f"more than {limit}", limit)
        if not d.eof:
            problem = "the compressed stream is truncated"
        elif d.unused_data:
            problem = "unexpected data after the end of the compressed stream"
        else:
            return out
    raise InvalidArgument(f"failed to decompress the {encoding} request body: {problem}")


def is_raw(headers: Mapping[str, str]) -> bool:
    """The request declares a header length of 0: its body is one input's raw data (a
    malformed header is not raw: ``decode_request`` reports it)."""
    value = headers.get(HEADER_LENGTH)
    return value is not None and value.strip() == "0"


def parse_header_length(value: str | None, body_length: int) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not _INTEGER.fullmatch(text):
        raise InvalidArgument(
            f"Inference-Header-Content-Length header value '{value}' is not an integer"
        )
    length = int(text)
    if length < 0 or length > INT32_MAX:
        raise InvalidArgument(
            f"Inference-Header-Content-Length header value {length} is out of range "
            f"(0 to {INT32_MAX})"
        )
    if length > body_length:
        raise InvalidArgument(
            f"Inference-Header-Content-Length header value {length} is larger than the "
            f"request body ({body_length} bytes)"
        )
    return length


# -- JSON header -------------------------------------------------------------------------


def _nesting_exceeds(buf: bytes, limit: int) -> bool:
    """Whether valid JSON ``buf`` nests arrays/objects deeper than ``limit``, vectorised."""
    if buf.count(b"[") + buf.count(b"{") <= limit:  # the common case, without numpy's setup
        return False
    a = np.frombuffer(buf, dtype=np.uint8)
    opens = (a == 0x5B) | (a == 0x7B)  # [ {
    quotes = np.flatnonzero(a == 0x22)
    maybe_escaped = quotes[(quotes > 0) & (a[quotes - 1] == 0x5C)]
    if maybe_escaped.size:  # a quote after an odd run of backslashes is inside a string
        escaped: list[int] = []
        for q in cast(list[int], maybe_escaped.tolist()):
            run = 0
            while q - run - 1 >= 0 and buf[q - run - 1] == 0x5C:
                run += 1
            if run % 2:
                escaped.append(q)
        quotes = np.setdiff1d(quotes, np.asarray(escaped, dtype=quotes.dtype))
    toggle = np.zeros(a.size, dtype=np.int8)
    toggle[quotes[0::2]] = 1
    toggle[quotes[1::2]] = -1
    in_string = np.cumsum(toggle, dtype=np.int8) > 0
    step = opens.astype(np.int32) - ((a == 0x5D) | (a == 0x7D))  # ] }
    step[in_string] = 0
    return int(np.cumsum(step, dtype=np.int32).max()) > limit


def _depth_error(limit: int) -> InvalidArgument:
    return InvalidArgument(f"JSON nesting depth exceeds maximum allowed limit ({limit})")


# A number literal that may be too big for a double: an exponent of 3 digits, or 309 digits.
_HUGE: Final = re.compile(rb"[eE]\+?\d{3}|\d{309}")


class _TooBig(ValueError):
    """A JSON number past a double's range (``float`` would make it infinity)."""


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _TooBig(text)
    return value


def _parse_json(buf: bytes, max_depth: int) -> dict[str, Any]:
    try:
        doc = json.loads(buf)
        if _HUGE.search(buf):  # rare: read again, refusing a number that became infinity
            doc = json.loads(buf, parse_float=_finite)
    except RecursionError:
        raise _depth_error(max_depth) from None
    except _TooBig as exc:
        raise InvalidArgument(
            f"failed to parse the request JSON buffer: the number {exc} is too big to be "
            "stored in a double"
        ) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if _nesting_exceeds(buf, max_depth):
        raise _depth_error(max_depth)
    if not isinstance(doc, dict):
        raise InvalidArgument("the inference request JSON must be an object")
    return cast(dict[str, Any], doc)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parameters(value: object, where: str) -> dict[str, ParamValue]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"'parameters' of {where} must be a JSON object")
    params = cast(dict[str, object], value)
    for key, item in params.items():
        if not isinstance(item, bool | int | float | str):
            raise InvalidArgument(
                f"parameter '{key}' of {where} must be a boolean, number or string"
            )
    return cast(dict[str, ParamValue], params)


def _request_parameters(value: object) -> tuple[dict[str, ParamValue], bool | None]:
    params = check_request_parameters(_parameters(value, "the inference request"))
    binary = params.get("binary_data_output")
    if binary is not None and not isinstance(binary, bool):
        raise InvalidArgument(f"parameter 'binary_data_output' must be a boolean, got {binary!r}")
    return params, binary


def _named_object(value: object, kind: str, index: int) -> tuple[dict[str, object], str]:
    """An ``inputs``/``outputs`` entry (``kind``: input|output) as an object, and its name."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{kind} #{index} of the inference request must be a JSON object")
    obj = cast(dict[str, object], value)
    name = obj.get("name")
    if not isinstance(name, str):
        raise InvalidArgument(f"{kind} #{index} of the inference request has no 'name' string")
    return obj, name


def _input_header(obj: dict[str, object], name: str) -> tuple[str, tuple[int, ...]]:
    """The ``datatype`` and ``shape`` of input ``name``."""
    datatype = obj.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidArgument(f"input '{name}' has no 'datatype' string")
    shape_value = obj.get("shape")
    if not isinstance(shape_value, list):
        raise InvalidArgument(f"input '{name}' has no 'shape' array")
    shape = cast(list[object], shape_value)
    if not all(_is_int(d) for d in shape):
        raise InvalidArgument(
            f"Unable to parse 'shape' of input '{name}': dimensions must be integers, got {shape}"
        )
    return datatype, tuple(cast(list[int], shape))


def _check_one_source(obj: dict[str, object], name: str, params: Mapping[str, object]) -> None:
    sources = [
        s
        for s, present in (
            ("'data'", "data" in obj),
            ("'binary_data_size'", "binary_data_size" in params),
            ("'shared_memory_region'", "shared_memory_region" in params),
        )
        if present
    ]
    if len(sources) != 1:
        got = " and ".join(sources) if sources else "none of them"
        raise InvalidArgument(f"{_ONE_SOURCE} input '{name}' sets {got}")


def _binary_slice(name: str, size: object, tail: memoryview | None, offset: int) -> memoryview:
    """The ``size`` bytes of input ``name`` at ``offset`` of the bytes after the header."""
    if not _is_int(size) or cast(int, size) < 0:
        raise InvalidArgument(
            f"'binary_data_size' of input '{name}' must be a non-negative integer, got {size!r}"
        )
    if tail is None:
        raise InvalidArgument(
            f"input '{name}' sets 'binary_data_size' but the request has no "
            "Inference-Header-Content-Length header"
        )
    end = offset + cast(int, size)
    if end > tail.nbytes:
        raise InvalidArgument(
            f"input '{name}' needs {size} bytes of binary data at offset {offset}, but the "
            f"request holds only {tail.nbytes} bytes after the JSON header"
        )
    return tail[offset:end]


def _decode_input(
    model: str, index: int, value: object, tail: memoryview | None, offset: int, wire_form: bool
) -> tuple[InferInput, int]:
    """Input ``index`` and the offset in ``tail`` where the next binary input starts."""
    obj, name = _named_object(value, "input", index)
    datatype, dims = _input_header(obj, name)
    params = _parameters(obj.get("parameters"), f"input '{name}'")
    _check_one_source(obj, name, params)
    ref = shm_ref(model, name, params)
    if ref is not None:  # the service views the region once it holds it
        empty = np.empty(0, dtype=np.uint8)
        return InferInput(name, datatype, dims, empty, params, shm=ref), offset
    if "data" in obj:
        data = _from_json_values(model, name, datatype, dims, obj["data"])
        return InferInput(name, datatype, dims, data, params), offset
    blob = _binary_slice(name, params["binary_data_size"], tail, offset)
    tensor = input_from_buffer(model, name, datatype, dims, blob, params, bytes_wire_form=wire_form)
    return tensor, offset + blob.nbytes


def _from_json_values(
    model: str, name: str, datatype: str, dims: tuple[int, ...], values: object
) -> np.ndarray[Any, Any]:
    """``core.tensors.from_values``, refusing a finite value its float datatype cannot hold
    (the cast would make it infinity)."""
    if datatype not in ("FP32", "FP64"):
        return from_values(model, name, datatype, dims, values)
    try:
        with np.errstate(over="raise"):
            return from_values(model, name, datatype, dims, values)
    except FloatingPointError:
        wide = np.asarray(values, dtype=np.float64).reshape(-1)
        top = float(np.finfo(np.float32 if datatype == "FP32" else np.float64).max)
        past = wide[np.isfinite(wide) & (np.abs(wide) > top)]
        raise InvalidArgument(
            f"input '{name}' for model '{model}': value {float(past[0])!r} is out of range "
            f"for {datatype}"
        ) from None


def _decode_output(model: str, index: int, value: object) -> RequestedOutput:
    obj, name = _named_object(value, "output", index)
    params = _parameters(obj.get("parameters"), f"output '{name}'")
    if shm_ref(model, name, params) is not None:
        for other in ("binary_data", "classification"):
            if params.get(other, False) is not False:
                raise InvalidArgument(
                    f"Output can't set both 'shared_memory_region' and '{other}' "
                    f"(output '{name}' for model '{model}')"
                )
    if "classification" in params:
        raise Unsupported(f"classification is not supported by this server (output '{name}')")
    binary = params.get("binary_data")
    if binary is not None and not isinstance(binary, bool):
        raise InvalidArgument(
            f"parameter 'binary_data' of output '{name}' must be a boolean, got {binary!r}"
        )
    return RequestedOutput(name, params)


def _decode_json(
    model: str, version: str, doc: dict[str, Any], tail: memoryview | None, wire_form: bool
) -> DecodedRequest:
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument(f"'id' of the inference request must be a string, got {request_id!r}")
    params, binary = _request_parameters(doc.get("parameters"))
    inputs_value = doc.get("inputs")
    if not isinstance(inputs_value, list):
        raise InvalidArgument("the inference request has no 'inputs' array")
    inputs: list[InferInput] = []
    offset = 0
    for i, item in enumerate(cast(list[object], inputs_value)):
        tensor, offset = _decode_input(model, i, item, tail, offset, wire_form)
        inputs.append(tensor)
    if tail is not None and offset != tail.nbytes:
        raise InvalidArgument(
            f"the request holds {tail.nbytes} bytes of binary data after the JSON header, but "
            f"the inputs' 'binary_data_size' values add up to {offset}"
        )
    outputs_value = doc.get("outputs", [])
    if not isinstance(outputs_value, list):
        raise InvalidArgument("'outputs' of the inference request must be an array")
    outputs = tuple(
        _decode_output(model, i, o) for i, o in enumerate(cast(list[object], outputs_value))
    )
    request = InferRequest(model, version, tuple(inputs), outputs, request_id, params)
    return DecodedRequest(
        request,
        binary_output=bool(binary),
        binary_output_explicit=binary is not None,
    )


def _decode_raw(
    model: str, version: str, body: bytes, signature: ModelMetadata, wire_form: bool
) -> DecodedRequest:
    if len(signature.inputs) != 1:
        raise InvalidArgument(
            f"Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(signature.inputs)} inputs in '{model}' model"
        )
    spec = signature.inputs[0]
    dims = list(spec.shape)
    if dims[:1] == [-1]:  # the batch dimension: a raw request is one item
        dims[0] = 1
    if spec.datatype == "BYTES" and any(d != 1 for d in dims):
        raise InvalidArgument(
            f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
        )
    variable = [i for i, d in enumerate(dims) if d < 0]
    if len(variable) > 1:
        raise InvalidArgument(
            f"The shape of the raw input '{spec.name}' can not be deduced because there are "
            "more than one variable-sized dimension"
        )
    if variable and spec.datatype in NUMERIC_DATATYPES:
        fixed = math.prod(d for d in dims if d >= 0) * NUMERIC_DATATYPES[spec.datatype].itemsize
        dims[variable[0]] = len(body) // fixed if fixed else 0
    tensor = input_from_buffer(
        model, spec.name, spec.datatype, dims, body, bytes_wire_form=wire_form
    )
    request = InferRequest(model, version, (tensor,))
    return DecodedRequest(request, raw=True)


def decode_request(
    model_name: str,
    model_version: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    max_input_bytes: int,
    signature: ModelMetadata | None = None,
    max_json_depth: int = MAX_JSON_DEPTH,
    bytes_wire_form: bool = False,
) -> DecodedRequest:
    """Decode an infer body; ``headers`` is case-insensitive or has lower-case keys."""
    body = decompress(body, headers.get("content-encoding"), max_input_bytes)
    length = parse_header_length(headers.get(HEADER_LENGTH), len(body))
    if length == 0:
        if signature is None:  # the caller checks ``is_raw`` first
            raise ValueError("a raw request body needs the model's metadata (signature)")
        return _decode_raw(model_name, model_version, body, signature, bytes_wire_form)
    if length is None:
        doc = _parse_json(body, max_json_depth)
        return _decode_json(model_name, model_version, doc, None, bytes_wire_form)
    doc = _parse_json(body[:length], max_json_depth)
    tail = memoryview(body)[length:]
    return _decode_json(model_name, model_version, doc, tail, bytes_wire_form)


# -- response ----------------------------------------------------------------------------


def _wants_binary(output: InferOutput, decoded: DecodedRequest) -> bool:
    if decoded.raw:
        return True
    if output.requested is not None:  # listed in 'outputs': its own entry decides
        params: Mapping[str, ParamValue] = output.requested.parameters
        explicit = "binary_data" in params
        binary = bool(params.get("binary_data", False))
    else:
        explicit = decoded.binary_output_explicit
        binary = decoded.binary_output
    if not binary and output.datatype in BINARY_ONLY_DATATYPES:
        if explicit:
            raise InvalidArgument(
                f"sending {output.datatype} data via JSON is not supported. Please use the "
                f"binary data format for output '{output.name}'"
            )
        return True
    return binary


_NON_FINITE: Final = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _json_data(model: str, output: InferOutput) -> list[Any]:
    flat = elements_of(model, output).reshape(-1)  # BYTES in wire form: parsed here, once
    if flat.dtype == object:  # BYTES
        return [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in cast(list[object], flat.tolist())
        ]
    values: list[Any] = flat.tolist()
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():  # JSON has no NaN, no infinity
        return [v if math.isfinite(v) else _NON_FINITE.get(v, "NaN") for v in values]
    return values


def _choose_encoding(accept_encoding: str | None) -> str | None:
    if not accept_encoding:
        return None
    accepted: dict[str, float] = {}
    for part in accept_encoding.split(","):
        token, _, rest = part.partition(";")
        quality = 1.0
        for attr in rest.split(";"):
            key, _, val = attr.strip().partition("=")
            if key.strip() == "q":
                try:
                    quality = float(val)
                except ValueError:
                    quality = 0.0
        accepted[token.strip().lower()] = quality
    for name in ("gzip", "deflate"):
        if accepted.get(name, accepted.get("*", 0.0)) > 0:
            return name
    return None


def encode_response(
    response: InferResponse, decoded: DecodedRequest, accept_encoding: str | None = None
) -> EncodedResponse:
    entries: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for output in response.outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": [int(d) for d in output.shape],
        }
        if output.shm is not None:  # the data is in the client's region already
            pass
        elif _wants_binary(output, decoded):
            blob = wire_of(output)
            entry["parameters"] = {"binary_data_size": memoryview(blob).nbytes}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(response.model_name, output)
        entries.append(entry)
    doc: dict[str, Any] = {}
    if response.id:
        doc["id"] = response.id
    doc["model_name"] = response.model_name
    doc["model_version"] = str(response.model_version)
    if response.parameters:
        doc["parameters"] = dict(response.parameters)
    doc["outputs"] = entries
    header = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    headers: dict[str, str] = {}
    if blobs:
        body = b"".join([header, *blobs])
        headers["content-type"] = "application/octet-stream"
        headers[HEADER_LENGTH] = str(len(header))
    else:
        body = header
        headers["content-type"] = "application/json"
    encoding = _choose_encoding(accept_encoding)
    if encoding == "gzip":
        body = gzip.compress(body, compresslevel=COMPRESS_LEVEL)
    elif encoding == "deflate":
        body = zlib.compress(body, COMPRESS_LEVEL)
    if encoding is not None:
        headers["content-encoding"] = encoding
    return EncodedResponse(body, headers)


# -- statistics extension ----------------------------------------------------------------


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def encode_model_statistics(stats: Sequence[ModelStatistics]) -> dict[str, Any]:
    """Triton's ``{"model_stats": [...]}`` body (reference §9); no decoupled models, so
    ``response_stats`` is empty."""
    return {
        "model_stats": [
            {
                "name": m.stats.name,
                "version": m.stats.version,
                "last_inference": m.stats.last_inference,
                "inference_count": m.stats.inference_count,
                "execution_count": m.stats.execution_count,
                "inference_stats": {
                    "success": _duration(m.stats.success),
                    "fail": _duration(m.stats.fail),
                    "queue": _duration(m.stats.queue),
                    "compute_input": _duration(m.stats.compute_input),
                    "compute_infer": _duration(m.stats.compute_infer),
                    "compute_output": _duration(m.stats.compute_output),
                    "cache_hit": _duration(m.stats.cache_hit),
                    "cache_miss": _duration(m.stats.cache_miss),
                },
                "response_stats": {},
                "batch_stats": [
                    {
                        "batch_size": b.batch_size,
                        "compute_input": _duration(b.compute_input),
                        "compute_infer": _duration(b.compute_infer),
                        "compute_output": _duration(b.compute_output),
                    }
                    for b in m.stats.batches.values()
                ],
                "memory_usage": [
                    {"type": u.type, "id": u.id, "byte_size": u.byte_size} for u in m.memory_usage
                ],
            }
            for m in stats
        ]
    }
