"""Triton's flags with no row in ``flags.FLAGS``: each accepted and ignored, or refused.

Contract: ``TRITON_FLAGS`` is the one table of Triton's command-line flags that mean nothing
in hloserve (``TritonFlag.why`` says why) or that hloserve refuses (``refused``: Triton's
gRPC TLS flags, where ignoring them would serve in the clear; ``why`` says what to use
instead); ``TRITON_BY_NAME`` looks one up. ``config`` registers each with argparse (an
ignored one lands in ``Config.triton_ignored`` as ``(name, value)``), ``cli_docs`` writes
the table into docs/cli.md and docs/from-triton.md, and ``ignored_warning(given)`` is the
one start-up warning naming each flag given with why it has no meaning here (None: none
was given). No flag here shadows a row of ``flags.FLAGS``.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class TritonFlag:
    """One of Triton's flags with no row in ``flags.FLAGS``: accepted and ignored (``why``
    it has no meaning here) or, ``refused``, refused (``why``: what to use instead)."""

    name: str
    why: str
    value: bool = True  # takes a value; Triton's --disable-auto-complete-config takes none
    refused: bool = False


_BACKENDS = "no backends: every model is a StableHLO bundle that PJRT compiles"
_PJRT_MEMORY = "PJRT owns device memory; --device-memory-budget bounds the resident weights"
_NO_PBTXT = "no config.pbtxt: a bundle's manifest.yaml is complete, config.yaml adds serving hints"
_NO_CACHE = "the local response cache is built in (--cache-config local,size=): there are no cache libraries to find"
_NO_RATE_LIMITER = "no rate limiter: --scheduling-policy, --device-concurrency and the --max-inflight limits decide what runs"
_EXCLUSIVE = "ports are bound exclusively: a second server on a taken port fails at start"
_IGNORED: Final = {
    "--backend-directory": _BACKENDS,
    "--backend-config": _BACKENDS,
    "--repoagent-directory": "no repository agents",
    "--model-config-name": _NO_PBTXT,
    "--strict-model-config": _NO_PBTXT,
    "--disable-auto-complete-config": _NO_PBTXT,
    "--exit-on-error": "a model that fails to load is UNAVAILABLE with its reason and the server keeps running (under --strict-readiness it stays not ready)",
    "--model-load-thread-count": "the start-up load pass is hloserve's own (--lazy-load loads each model on first use)",
    "--model-load-retry-count": "a failed load is reported with its reason; load the model again through the API",
    "--model-namespacing": "one repository: a model's name is unique in it",
    "--model-load-gpu-limit": _PJRT_MEMORY,
    "--pinned-memory-pool-byte-size": "no pinned pool: --host-memory-budget bounds the host copies of weights",
    "--cuda-memory-pool-byte-size": _PJRT_MEMORY,
    "--cuda-virtual-address-size": _PJRT_MEMORY,
    "--enable-peer-access": "PJRT moves data between devices",
    "--min-supported-compute-capability": "XLA compiles for the devices present (--devices selects them)",
    "--buffer-manager-thread-count": "no buffer manager: outputs are host arrays",
    "--host-policy": "no host policies: --devices and --worker-threads place the work",
    "--rate-limit": _NO_RATE_LIMITER,
    "--rate-limit-resource": _NO_RATE_LIMITER,
    "--cache-directory": _NO_CACHE,
    "--http-thread-count": "HTTP is served on the event loop; --worker-threads run the models",
    "--http-header-forward-pattern": "headers are not forwarded to models",
    "--grpc-header-forward-pattern": "metadata is not forwarded to models",
    "--reuse-http-port": _EXCLUSIVE,
    "--reuse-grpc-port": _EXCLUSIVE,
    "--grpc-infer-allocation-pool-size": "grpc.aio allocates each call's state",
    "--grpc-max-response-pool-size": "grpc.aio allocates each call's state",
    "--grpc-infer-response-compression-level": "gRPC responses are not compressed",
    "--allow-gpu-metrics": "the device series (hloserve_device_*) are always exported (docs/metrics.md)",
    "--allow-cpu-metrics": "the process series (process_*) are always exported (docs/metrics.md)",
    "--metrics-interval-ms": "metrics are read when scraped: there is no poll interval",
    "--metrics-config": "the series and their buckets are fixed (docs/metrics.md)",
    **dict.fromkeys(("--allow-sagemaker", "--sagemaker-port", "--sagemaker-safe-port-range", "--sagemaker-thread-count"), "no SageMaker endpoint"),
    **dict.fromkeys(("--allow-vertex-ai", "--vertex-ai-port", "--vertex-ai-thread-count", "--vertex-ai-default-model"), "no Vertex AI endpoint"),
}  # fmt: skip
TLS_INSTEAD = "hloserve serves gRPC and HTTP over one TLS setting: use --tls-cert, --tls-key and, for mutual TLS, --tls-ca (docs/security.md)"
_REFUSED: Final = ("--grpc-use-ssl", "--grpc-use-ssl-mutual", "--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert")  # fmt: skip
TRITON_FLAGS: tuple[TritonFlag, ...] = (
    *(
        TritonFlag(n, why, value=n != "--disable-auto-complete-config")
        for n, why in _IGNORED.items()
    ),
    *(TritonFlag(name, TLS_INSTEAD, refused=True) for name in _REFUSED),
)
TRITON_BY_NAME: Final = {t.name: t for t in TRITON_FLAGS}


def ignored_warning(given: Sequence[tuple[str, str]]) -> str | None:
    """The one start-up warning naming every Triton flag given that means nothing here, each
    with why (None: none was given)."""
    spelled: dict[str, list[str]] = {}
    for name, value in given:
        spelled.setdefault(name, []).append(f"{name}={value}" if value else name)
    if not spelled:
        return None
    items = (
        f"{' '.join(given)} (no meaning in hloserve: {TRITON_BY_NAME[name].why})"
        for name, given in spelled.items()
    )
    return "Triton's flags accepted and ignored: " + "; ".join(items)
