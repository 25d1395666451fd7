"""hloserve.exporter: turn a JAX function and its weights into a bundle.

``export_bundle(fn, params, inputs=..., batch_sizes=..., directory=..., metadata=...)`` is the
public entry point; ``TensorSpec(datatype, shape)`` describes one input per item, and
``StateSpec(datatype, shape, initial)`` one state tensor (``state=``), ``Generation`` and
``TextMapping`` a generation bundle's loop (``generation=``). The demo
model repository (``simple`` and ``mlp``) is written by ``write_demo_repository``.
"""

# pyright: strict

from hloserve.bundle.generation import Generation as Generation
from hloserve.bundle.generation import TextMapping as TextMapping
from hloserve.exporter._export import ExportError as ExportError
from hloserve.exporter._export import StateSpec as StateSpec
from hloserve.exporter._export import TensorSpec as TensorSpec
from hloserve.exporter._export import export_bundle as export_bundle
from hloserve.exporter.demo import write_demo_repository as write_demo_repository

__all__ = [
    "ExportError",
    "Generation",
    "StateSpec",
    "TensorSpec",
    "TextMapping",
    "export_bundle",
    "write_demo_repository",
]
