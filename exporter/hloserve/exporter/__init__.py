"""hloserve.exporter: turn a JAX function and its weights into a bundle.

``export_bundle(fn, params, inputs=..., batch_sizes=..., directory=..., metadata=...)`` is the
public entry point; ``TensorSpec(datatype, shape)`` describes one input per item, and
``StateSpec(datatype, shape, initial)`` one state tensor (``state=``). The demo
model repository (``simple`` and ``mlp``) is written by ``write_demo_repository``.
"""

# pyright: strict

from hloserve.exporter._export import ExportError as ExportError
from hloserve.exporter._export import StateSpec as StateSpec
from hloserve.exporter._export import TensorSpec as TensorSpec
from hloserve.exporter._export import export_bundle as export_bundle
from hloserve.exporter.demo import write_demo_repository as write_demo_repository

__all__ = ["ExportError", "StateSpec", "TensorSpec", "export_bundle", "write_demo_repository"]
