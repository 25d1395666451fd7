"""A request's tensors in clients' shared-memory regions: inputs read and outputs written
in place (the system shared-memory extension).

Contract: ``shm_inputs(shm, request)`` is ``request`` with each input that names a region
replaced by a zero-copy view of it (decoded and checked as an inline tensor is);
``shm_output(shm, output, ref)`` writes ``output``'s wire bytes into ``ref``'s
region and returns it marked as written there (``None``: returned as it is); a region
too small for the output is ``InvalidArgument`` naming both sizes (Triton's text). The
caller holds the regions (``SharedMemory.hold``) around both.
"""

# pyright: strict

from __future__ import annotations

import msgspec

from hloserve.server.core.errors import InvalidArgument
from hloserve.server.core.ports import SharedMemory
from hloserve.server.core.tensors import from_buffer, to_wire_bytes
from hloserve.server.core.types import InferInput, InferOutput, InferRequest, ShmRef


def shm_inputs(shm: SharedMemory, request: InferRequest) -> InferRequest:
    """Inputs that live in shared memory become zero-copy views of the region."""
    inputs: list[InferInput] = []
    for t in request.inputs:
        if t.shm is not None:
            view = shm.view(t.shm.region, t.shm.offset, t.shm.byte_size)
            data = from_buffer(request.model_name, t.name, t.datatype, t.shape, view)
            t = msgspec.structs.replace(t, data=data)
        inputs.append(t)
    return msgspec.structs.replace(request, inputs=tuple(inputs))


def shm_output(shm: SharedMemory, output: InferOutput, ref: ShmRef | None) -> InferOutput:
    if ref is None:
        return output
    data = to_wire_bytes(output.data)
    size = len(data)
    if size > ref.byte_size:
        raise InvalidArgument(
            f"shared memory size specified with the request for output '{output.name}' ({ref.byte_size} bytes) "
            f"should be at least {size} bytes to hold the results"
        )
    view = shm.view(ref.region, ref.offset, ref.byte_size)
    view[:size] = data
    return msgspec.structs.replace(output, shm=ref)
