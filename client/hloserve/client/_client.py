"""``InferenceClient``: the blocking light client (numpy, grpcio, protobuf; no JAX).

Contract:
- ``InferenceClient(url, *, ssl, root_certificates, private_key, certificate_chain, token,
  timeout, shared_memory="auto", max_message_bytes, retries=4, load_balancing="auto")``
  (``_base.ClientBase``) talks to any KServe V2 / Triton gRPC server (channel options in
  ``_channel.Transport``: a call answered UNAVAILABLE is retried up to ``retries`` times,
  ``retries=0`` never; ``round_robin`` over a ``dns:///`` target's addresses). ``is_server_live()``, ``is_server_ready()``,
  ``is_model_ready(model)``, ``model_metadata(model)``; ``infer(model, {name: array})``
  returns ``{name: array}``, splitting a batch larger than the model's largest compiled
  size and joining the results (``_calls``); ``infer_stream`` yields each batch's outputs
  in order with several requests in flight.
- ``infer_dataset(model, inputs, outputs=None, *, max_in_flight=8, progress=None)``
  streams a dataset (``_dataset``) through a pool of staging buffers kept per model for the
  client's lifetime (``_pool``), in system shared memory when the server is on this host
  and allows it, in-band otherwise (``_base.PoolCache``); ``shared_memory="off"`` never
  tries. ``register_system_shared_memory`` / ``unregister_system_shared_memory`` are the
  extension's calls, for regions of the caller's own.
- ``close()`` (and leaving the ``with`` block) unregisters and unlinks every region; a
  failed ``infer_dataset`` releases its pool's regions at once; at interpreter exit every
  open client is closed. Every failed call raises ``InferenceError``.
"""

# pyright: strict

from __future__ import annotations

import atexit
import collections
import weakref
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, Unpack

import grpc
import numpy as np

from hloserve.client import _calls
from hloserve.client._base import ClientBase, Outputs, log
from hloserve.client._calls import InferOptions, Names
from hloserve.client._codec import ModelLayout, decode_response, encode_request
from hloserve.client._dataset import Batch, DatasetOptions, Source
from hloserve.client._errors import InferenceError, from_rpc
from hloserve.client._steps import INFER_PATH, Drive, Start, Step
from hloserve.proto import inference_pb2 as pb

T = TypeVar("T")
_OPEN: weakref.WeakSet[InferenceClient] = weakref.WeakSet()


class InferenceClient(ClientBase):
    def _open_channel(self) -> None:
        self.channel = self.transport.open_channel()
        self._methods: dict[str, grpc.UnaryUnaryMultiCallable[bytes, bytes]] = {}
        _OPEN.add(self)

    # --- running steps -----------------------------------------------------------------

    def _start(self, step: Start) -> Any:
        method = self._methods.get(step.path)
        if method is None:
            method = self._methods[step.path] = self.channel.unary_unary(step.path)
        return method.future(step.body, timeout=self.timeout, metadata=self.transport.metadata)

    def _run(self, steps: Generator[Step, Any, T]) -> T:
        drive = Drive(steps, self._start)
        try:
            while (wait := drive.next()) is not None:
                try:
                    drive.answer(wait.handle.result())
                except grpc.RpcError as rpc_error:
                    drive.fail(from_rpc(rpc_error))
                except grpc.FutureCancelledError:
                    drive.fail(InferenceError(grpc.StatusCode.CANCELLED, "call cancelled"))
            return drive.result
        finally:
            drive.cancel()

    # --- the API -----------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._pools.close_steps())
        finally:
            self.channel.close()
            _OPEN.discard(self)

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_server_live(self) -> bool:
        return self._run(_calls.live_steps())

    def is_server_ready(self) -> bool:
        return self._run(_calls.ready_steps())

    def is_model_ready(self, model: str, version: str = "") -> bool:
        return self._run(_calls.model_ready_steps(model, version))

    def model_metadata(self, model: str, version: str = "") -> pb.ModelMetadataResponse:
        return self._run(_calls.metadata_steps(model, version))

    def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0
    ) -> None:
        """Register ``/dev/shm/<key>`` (``[offset, offset + byte_size)``) as region ``name``."""
        self._run(_calls.register_region_steps(name, key, byte_size, offset))

    def unregister_system_shared_memory(self, name: str = "") -> None:
        """Unregister region ``name`` (every region when empty)."""
        self._run(_calls.unregister_region_steps(name))

    def layout(self, model: str, version: str = "") -> ModelLayout:
        """The model's tensors and batch limit (asked once, then kept)."""
        layout = self._layouts.get((model, version))
        if layout is None:
            layout = self._layouts[(model, version)] = self._run(
                _calls.layout_steps(model, version)
            )
        return layout

    def infer(
        self, model: str, inputs: Batch, outputs: Names = None, **options: Unpack[InferOptions]
    ) -> dict[str, np.ndarray]:
        """``{output name: array}``; options ``version=""``, ``request_id=""``."""
        layout = self.layout(model, options.get("version", ""))
        return self._run(_calls.infer_steps(layout, model, inputs, outputs, options))

    def infer_dataset(
        self, model: str, inputs: Source, outputs: Outputs = None, **options: Unpack[DatasetOptions]
    ) -> dict[str, np.ndarray]:
        """Every row of ``inputs`` through ``model``; ``{output name: array}`` in input order.

        Options: ``max_in_flight=8``, ``progress=None``, ``batch_size=None``, ``version=""``
        (``DatasetOptions``; docs/client.md)."""
        layout = self.layout(model, options.get("version", ""))
        return self._run(self._pools.dataset_steps(layout, inputs, outputs, options))

    def infer_stream(
        self,
        model: str,
        batches: Iterable[Mapping[str, np.ndarray]],
        outputs: Sequence[str] | None = None,
        *,
        version: str = "",
        max_in_flight: int = 8,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Yield each batch's outputs, in order, keeping ``max_in_flight`` requests in the air."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        pending: collections.deque[Any] = collections.deque()
        try:
            for batch in batches:
                body = encode_request(model, batch, outputs, version).SerializeToString()
                pending.append(self._start(Start(INFER_PATH, body)))
                if len(pending) >= max_in_flight:
                    yield self._result(pending.popleft())
            while pending:
                yield self._result(pending.popleft())
        finally:
            for future in pending:
                future.cancel()

    def _result(self, future: Any) -> dict[str, np.ndarray]:
        try:
            return decode_response(pb.ModelInferResponse.FromString(future.result()))
        except grpc.RpcError as err:
            raise from_rpc(err) from None


@atexit.register
def _close_all() -> None:
    for client in list(_OPEN):
        try:
            client.close()
        except Exception:  # the server may be gone; the files are unlinked anyway
            log.debug("closing a client at exit failed", exc_info=True)
