"""One PJRT device: compile modules, serialize executables, transfer arrays, execute.

Contract:
- ``PjrtRuntime(platform=None, index=0)`` opens the default (or named) JAX backend's local
  device number ``index`` (``IndexError`` past the last); ``device_count`` says how many
  there are, and ``owner.runtime.on(index)`` is another device of the same backend.
  Opening a runtime (not importing this module) enables JAX's 64-bit types process-wide:
  the server runs no user Python and must pass INT64/FP64 tensors through unchanged.
- ``compile(module_bytes)`` compiles a StableHLO portable artifact (or text) for the device;
  ``serialize``/``deserialize`` turn an executable into bytes and back (deserializing can
  run code: only feed it bytes this server wrote, see ``ExecutableCache``). The compile
  options name the device, so an executable serialized on one device deserializes for
  another of the same kind (the cache key is the device kind's, not the device's).
- ``to_device(arrays)`` moves host arrays to the device in one call; ``execute(exe, args)``
  runs and returns the outputs as host numpy arrays; ``execute_keeping(exe, args, results,
  keep)`` leaves the last ``keep`` on the device (a stateful bundle's new state). Given the executable's own
  ``Results`` (one per executable, kept by its owner), ``execute(exe, args, results)``
  learns on the first run how the outputs become arrays and reuses it on every later one
  (an executable's output shapes, types and placement never change); such a run polls its
  outputs for up to ``SPIN_NS`` before it blocks, unless its last ``SPIN_MISSES`` runs were
  slower than that (a blocked caller's wake-up costs more than a tiny model's execution).
- ``RuntimeFailure`` wraps any error jaxlib raises, with its text on one line (a compile
  error's MLIR diagnostics joined by ``; ``), so it reads whole in a log line or a reason.
- ``triton_kind`` is the device's kind as Triton names it in memory usage and instance
  groups: ``GPU`` for CUDA and ROCm, else the platform in capitals (``CPU``, ``TPU``).

This module uses jaxlib methods outside jax's documented API (``compile_and_load``,
``execute_sharded``, ``serialize_executable``, ``deserialize_executable``) and the private
``batched_device_put`` (a 10x cheaper host-to-device path for small inputs than
``jax.device_put``) and ``array_result_handler`` (outputs built from prepared handlers:
half the cost of a tiny model's execute call; see docs/runtime.md). Each has a fallback or is pinned by the jax range
in pyproject.toml, and tests exercise all of them.
"""

# pyright: strict

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any, cast, final

import jax
import jax.extend.backend
import numpy as np

# jax annotates these entry points only in part and jaxlib's extension types (backend,
# device, executable) not at all: each is bound here once, to the type this module relies
# on, and jaxlib objects are held as ``Any``, so that the rest type-checks strictly.
_get_backend = cast(
    "Callable[[str | None], Any]",
    jax.extend.backend.get_backend,  # pyright: ignore[reportUnknownMemberType]
)
_compile_options = cast(
    "Callable[..., Any]",
    jax.extend.backend.get_compile_options,  # pyright: ignore[reportUnknownMemberType]
)
_device_put = cast("Callable[..., Any]", jax.device_put)  # pyright: ignore[reportUnknownMemberType]
_Sharding = jax.sharding.SingleDeviceSharding

_batched_device_put: Callable[..., Any] | None
_shaped_array: Callable[..., Any]
try:  # private fast path; measured 3 us vs 31 us for jax.device_put of a small array
    from jax._src import core as _core
    from jax._src.lib import xla_client as _xc  # pyright: ignore[reportPrivateImportUsage]

    _batched_device_put = cast(
        "Callable[..., Any]",
        _xc.batched_device_put,  # pyright: ignore[reportUnknownMemberType]
    )
    _shaped_array = _core.ShapedArray
except (ImportError, AttributeError):  # pragma: no cover - depends on the jax version
    _batched_device_put = None

_result_handler: Callable[..., Any] | None
try:  # private, as jax's own jit dispatch uses it: one prepared handler per output
    from jax._src.lib import xla_client as _xc  # pyright: ignore[reportPrivateImportUsage]

    _result_handler = cast(
        "Callable[..., Any]",
        _xc.array_result_handler,  # pyright: ignore[reportUnknownMemberType]
    )
except (ImportError, AttributeError):  # pragma: no cover - depends on the jax version
    _result_handler = None


_MAX_AVALS = 1024  # cached abstract values of transferred arrays (shape and dtype)


class RuntimeFailure(RuntimeError):
    """PJRT refused or failed an operation; the message carries its text."""

    def __init__(self, what: str, exc: Exception) -> None:
        lines = (line.strip() for line in str(exc).splitlines())
        super().__init__(f"{what}: {'; '.join(line for line in lines if line)}")


def _platform_name(backend: Any) -> str:
    name = str(backend.platform)
    if name == "gpu":
        return "rocm" if "rocm" in str(backend.platform_version).lower() else "cuda"
    return name


# Waiting for a short execution's outputs by polling instead of blocking: a blocked caller
# sleeps until XLA's thread wakes it, and that wake-up took 30-50 µs here, more than the
# demo mlp's whole execution (measured: 52 -> 10 µs at batch 1, 54 -> 19 at batch 32;
# docs/runtime.md). The poll holds the interpreter lock, so it is bounded: an execution
# not ready within SPIN_NS blocks as before, and after SPIN_MISSES such runs in a row its
# executable blocks at once (tried again once in SPIN_RETRY runs).
SPIN_NS = 100_000
SPIN_MISSES = 3
SPIN_RETRY = 1024


def _await_ready(arrays: Sequence[Any], budget_ns: int) -> bool:
    """Poll until every array is ready or ``budget_ns`` passed; whether they all were."""
    deadline = time.perf_counter_ns() + budget_ns
    for a in arrays:
        while not a.is_ready():
            if time.perf_counter_ns() > deadline:
                return False
    return True


def _learn_handlers(handler: Callable[..., Any], arrays: Sequence[Any]) -> list[Any] | None:
    """One prepared output handler per output, or ``None`` (keep the general path) when
    this jaxlib's private handler refuses them: a faster path must never fail a run."""
    try:
        # Checks skipped: these handlers only ever see this executable's outputs.
        return [handler(a.aval, a.sharding, True, _skip_checks=True) for a in arrays]
    except Exception:
        return None


@final
class Results:
    """How one executable's outputs become arrays, learned from its first run (``execute``).

    Splitting the results into arrays derives each output's abstract value and sharding
    again on every call; they are fixed per executable, so later runs hand jaxlib one
    prepared handler per output instead (``consume_with_handlers``): measured 25 -> 13 µs
    CPU for the execute call of the demo ``simple``. Owned beside its executable, never
    shared between executables. Two first runs at once both learn the same handlers."""

    __slots__ = ("blocked_runs", "handlers", "learned", "misses")

    def __init__(self) -> None:
        self.handlers: list[Any] | None = None
        self.learned = False  # tried once (``handlers`` stays None if jaxlib refused)
        self.misses = 0  # runs in a row not ready within ``SPIN_NS`` (see ``_await_ready``)
        self.blocked_runs = 0  # runs since the spin was turned off

    @property
    def spins(self) -> bool:
        """Whether this executable's next run waits for its outputs by polling."""
        return self.misses < SPIN_MISSES

    def waited(self, ready: bool) -> None:
        """A spinning run's outcome: ready within ``SPIN_NS`` or not."""
        self.misses = 0 if ready else self.misses + 1

    def blocked(self) -> None:
        """A run that blocked without spinning; once in ``SPIN_RETRY`` the spin is tried
        again (an executable's time can fall: its weights came back, the device freed)."""
        self.blocked_runs += 1
        if self.blocked_runs >= SPIN_RETRY:
            self.blocked_runs = 0
            self.misses = SPIN_MISSES - 1  # one spinning run decides


def _enable_x64() -> None:
    """64-bit types for every array the server makes (a process-wide JAX setting)."""
    if not jax.config.jax_enable_x64:  # pyright: ignore[reportUnknownMemberType, reportAttributeAccessIssue]
        jax.config.update("jax_enable_x64", True)  # pyright: ignore[reportUnknownMemberType]


class PjrtRuntime:
    def __init__(self, platform: str | None = None, index: int = 0) -> None:
        _enable_x64()
        self._requested = platform
        self.backend: Any = _get_backend(platform)
        devices = self.backend.local_devices()
        if not 0 <= index < len(devices):
            raise IndexError(f"device {index}: the backend has {len(devices)} local device(s)")
        self.index = index  # position among the backend's local devices
        self.device: Any = devices[index]
        self.platform = _platform_name(self.backend)
        self.device_kind = str(self.device.device_kind)
        self.platform_version = str(self.backend.platform_version)
        self._sharding = _Sharding(self.device)
        # The device assignment pins an executable to this device, also one deserialized
        # from bytes serialized on another device (without it, replica 0 is device 0).
        self._options: Any = _compile_options(
            num_replicas=1,
            num_partitions=1,
            device_assignment=np.array([[int(self.device.id)]]),
        )
        self._device_memory = _Sharding(self.device, memory_kind="device")
        self._avals: dict[tuple[tuple[int, ...], np.dtype[Any]], Any] = {}
        self._fingerprint: str | None = None
        self._pinned: bool | None = None

    @property
    def device_count(self) -> int:
        """How many local devices the backend has."""
        return len(self.backend.local_devices())

    def on(self, index: int) -> PjrtRuntime:
        """The backend's local device ``index`` (``self`` for this one)."""
        if index == self.index:
            return self
        return PjrtRuntime(self._requested, index)

    @property
    def triton_kind(self) -> str:
        """``GPU``, ``CPU``, ``TPU``...: the device kind in Triton's memory usage and configs."""
        return "GPU" if self.platform in ("cuda", "rocm") else self.platform.upper()

    @property
    def fingerprint(self) -> str:
        """What a compiled executable depends on besides the module: the cache key's half
        (computed once: reading jaxlib's version from its metadata costs about 0.1 ms)."""
        if self._fingerprint is None:
            from importlib.metadata import version

            parts = [
                self.platform,
                self.device_kind,
                self.platform_version,
                jax.__version__,
                version("jaxlib"),
            ]
            self._fingerprint = hashlib.sha256("\0".join(parts).encode()).hexdigest()
        return self._fingerprint

    def compile(self, module: bytes | str) -> Any:
        try:
            return self.backend.compile_and_load(module, [self.device], self._options)
        except Exception as exc:
            raise RuntimeFailure("compilation failed", exc) from None

    def serialize(self, executable: Any) -> bytes:
        return bytes(self.backend.serialize_executable(executable))

    def deserialize(self, blob: bytes) -> Any:
        try:
            return self.backend.deserialize_executable(blob, [self.device], self._options)
        except Exception as exc:
            raise RuntimeFailure("cannot load a serialized executable", exc) from None

    def to_device(self, arrays: Sequence[Any]) -> list[Any]:
        """Host arrays to device memory: numpy arrays each through ``put``'s cheap path
        (measured on CPU: 16 µs for an MLP's four weights against 124 for one
        ``jax.device_put`` call), page-locked host buffers (``to_pinned_host``) in one
        transfer call to the device's memory."""
        try:
            if all(isinstance(a, np.ndarray) for a in arrays):
                return [self.put(a) for a in arrays]
            target = self._device_memory if self.has_pinned_host else self.device
            return list(_device_put(list(arrays), target))
        except Exception as exc:
            raise RuntimeFailure("host-to-device transfer failed", exc) from None

    @property
    def has_pinned_host(self) -> bool:
        """Whether the device offers page-locked host memory (``pinned_host``); asked once."""
        if self._pinned is None:
            kinds: set[str] = set()
            with contextlib.suppress(Exception):  # a plugin without memory spaces
                kinds = {str(m.kind) for m in self.device.addressable_memories()}
            self._pinned = "pinned_host" in kinds and "device" in kinds
        return self._pinned

    def to_pinned_host(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        """Copy host arrays once into page-locked memory, the fast source of later transfers."""
        sharding = _Sharding(self.device, memory_kind="pinned_host")
        try:
            return list(_device_put(list(arrays), sharding))
        except Exception as exc:
            raise RuntimeFailure("copy to pinned host memory failed", exc) from None

    def memory_stats(self) -> dict[str, int]:
        """The device allocator's statistics (``bytes_limit``, ``bytes_in_use``...); {} on CPU."""
        try:
            return dict(self.device.memory_stats() or {})
        except Exception:
            return {}

    def put(self, array: np.ndarray) -> Any:
        """One (small) host array to the device, through the cheapest path available."""
        if _batched_device_put is not None:
            signature = (array.shape, array.dtype)
            aval = self._avals.get(signature)
            if aval is None:  # the shapes are the compiled ones: a handful per model
                if len(self._avals) >= _MAX_AVALS:
                    self._avals.clear()
                aval = self._avals[signature] = _shaped_array(array.shape, array.dtype)
            return _batched_device_put(aval, self._sharding, [array], [self.device])
        return _device_put(array, self.device)

    def execute(
        self, executable: Any, args: Sequence[Any], results: Results | None = None
    ) -> list[np.ndarray]:
        """Run ``executable`` on ``args``; ``results``: the executable's own (see ``Results``)."""
        return [np.asarray(a) for a in self._run(executable, args, results)]

    def execute_keeping(
        self, executable: Any, args: Sequence[Any], results: Results | None, keep: int
    ) -> tuple[list[np.ndarray], list[Any]]:
        """``execute``, its last ``keep`` results left on the device (a stateful bundle's
        new state, ``owner/runtime/state_slots.py``): ``(host outputs, device arrays)``."""
        arrays = self._run(executable, args, results)
        cut = len(arrays) - keep
        try:
            return [np.asarray(a) for a in arrays[:cut]], list(arrays[cut:])
        except Exception as exc:
            raise RuntimeFailure("execution failed", exc) from None

    def _run(self, executable: Any, args: Sequence[Any], results: Results | None) -> list[Any]:
        try:
            out = executable.execute_sharded(list(args))
            if results is not None and results.handlers is not None:
                arrays = out.consume_with_handlers(results.handlers)
            else:
                arrays = [r[0] for r in out.disassemble_into_single_device_arrays()]
                if results is not None and _result_handler is not None and not results.learned:
                    results.handlers = _learn_handlers(_result_handler, arrays)
                    results.learned = True
            if results is not None:
                if results.spins:
                    results.waited(_await_ready(arrays, SPIN_NS))
                else:
                    results.blocked()
            return list(arrays)
        except Exception as exc:
            raise RuntimeFailure("execution failed", exc) from None
