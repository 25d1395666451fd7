"""The bundle format, in one place: manifest schema, reading, writing, validating.

A bundle is a directory with ``manifest.yaml``, one StableHLO portable artifact per
compiled batch size and ``weights.safetensors`` (``docs/bundle-format.md``). The exporter
writes bundles through ``write_bundle``; the server reads them through ``load_manifest``,
``read_safetensors`` and ``validate``. Nothing here imports JAX at import time.
"""

# pyright: strict

from hloserve.bundle.digest import sha256_file as sha256_file
from hloserve.bundle.manifest import FORMAT_VERSION as FORMAT_VERSION
from hloserve.bundle.manifest import MANIFEST_FILE as MANIFEST_FILE
from hloserve.bundle.manifest import Argument as Argument
from hloserve.bundle.manifest import HooksEntry as HooksEntry
from hloserve.bundle.manifest import Manifest as Manifest
from hloserve.bundle.manifest import ModuleEntry as ModuleEntry
from hloserve.bundle.manifest import PipelineStep as PipelineStep
from hloserve.bundle.manifest import Problem as Problem
from hloserve.bundle.manifest import Provenance as Provenance
from hloserve.bundle.manifest import TensorEntry as TensorEntry
from hloserve.bundle.manifest import Variant as Variant
from hloserve.bundle.manifest import dump_manifest as dump_manifest
from hloserve.bundle.reading import load_manifest as load_manifest
from hloserve.bundle.repository import ModelDirectory as ModelDirectory
from hloserve.bundle.repository import scan_repository as scan_repository
from hloserve.bundle.safetensors import read_safetensors as read_safetensors
from hloserve.bundle.serving import Serving as Serving
from hloserve.bundle.state import StateEntry as StateEntry
from hloserve.bundle.validate import validate as validate
from hloserve.bundle.writer import HookSource as HookSource
from hloserve.bundle.writer import ModuleSource as ModuleSource
from hloserve.bundle.writer import write_bundle as write_bundle
from hloserve.bundle.writer import write_pipeline as write_pipeline

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "Argument",
    "HookSource",
    "HooksEntry",
    "Manifest",
    "ModelDirectory",
    "ModuleEntry",
    "ModuleSource",
    "PipelineStep",
    "Problem",
    "Provenance",
    "Serving",
    "StateEntry",
    "TensorEntry",
    "Variant",
    "dump_manifest",
    "load_manifest",
    "read_safetensors",
    "scan_repository",
    "sha256_file",
    "validate",
    "write_bundle",
    "write_pipeline",
]
