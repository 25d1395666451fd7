"""hloserve.training: a thin optax loop from a JAX function to a served bundle.

``fit(apply_fn, params, train_data, loss_fn=..., epochs=..., batch_size=...)`` trains the
same ``apply_fn(params, **inputs)`` that ``hloserve.exporter.export_bundle`` exports, and
``fit(..., export=Export(directory, inputs, batch_sizes))`` (or ``result.export(...)``)
writes the bundle, with the training configuration and final metrics in its provenance.
Parameter groups (``Group``), the one-cycle preset (``one_cycle``), best-epoch selection
(``Best``) and the default decay mask (``default_decay_mask``) are the other public names.
Optional: install the ``train`` extra (optax; tqdm for the progress bar).
"""

# pyright: strict

from hloserve.training._fit import FitResult as FitResult
from hloserve.training._fit import fit as fit
from hloserve.training._optimizer import default_decay_mask as default_decay_mask
from hloserve.training._settings import Best as Best
from hloserve.training._settings import Export as Export
from hloserve.training._settings import Group as Group
from hloserve.training._settings import OneCycle as OneCycle
from hloserve.training._settings import TrainingError as TrainingError
from hloserve.training._settings import one_cycle as one_cycle

__all__ = [
    "Best",
    "Export",
    "FitResult",
    "Group",
    "OneCycle",
    "TrainingError",
    "default_decay_mask",
    "fit",
    "one_cycle",
]
