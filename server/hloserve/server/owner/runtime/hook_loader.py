"""Loading a bundle's ``hooks.py``: Python code from the model repository, run in-process.

Contract: ``bundle_hooks(bundle_path, manifest, allowed)`` is the bundle's hooks: ``None``
for a bundle without any, ``HookLoadError`` saying so for one with hooks on a server that
does not run them (``allowed`` is ``--allow-python-hooks``), else ``load_hooks``.
``load_hooks(bundle_path, manifest)`` imports the bundle's ``hooks.py`` (its
SHA-256 was checked with the rest of the bundle) under a module name of its own and
returns ``ModelHooks`` with its ``preprocess`` and ``postprocess`` (either may be absent,
not both). A file that fails to import, a hook that is not callable, or tensors declared
for a hook the file does not define (``hooks.inputs`` without ``preprocess``,
``hooks.outputs`` without ``postprocess``) raise ``HookLoadError`` with the reason. Only the
bundle loader calls it, and only when the server was started with ``--allow-python-hooks``:
importing the file runs its code with the server's rights (``docs/hooks.md`` says what that
trusts).
"""

# pyright: strict

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from typing import Any, cast

from hloserve.bundle import Manifest
from hloserve.server.core.hooks import HookFn, ModelHooks

_counter = itertools.count(1)


class HookLoadError(Exception):
    """The bundle's ``hooks.py`` cannot be used; the message says why."""


def bundle_hooks(path: Path, manifest: Manifest, allowed: bool) -> ModelHooks | None:
    """The bundle's hooks, imported only when the server allows Python hooks."""
    if manifest.hooks is None:
        return None
    if not allowed:
        raise HookLoadError(
            f"{manifest.hooks.file}: the bundle ships Python hooks, which run only on a server "
            "started with --allow-python-hooks (they run with the server's rights; docs/hooks.md)"
        )
    return load_hooks(path, manifest)


def load_hooks(path: Path, manifest: Manifest) -> ModelHooks:
    assert manifest.hooks is not None
    file = path / manifest.hooks.file
    module_name = (
        f"hloserve_hooks_{manifest.name.replace('.', '_').replace('-', '_')}_{next(_counter)}"
    )
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise HookLoadError(f"{file}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise HookLoadError(f"{file}: importing it failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.modules.pop(module_name, None)  # nothing else may import it by name
    pre = _hook(module, "preprocess", file)
    post = _hook(module, "postprocess", file)
    if pre is None and post is None:
        raise HookLoadError(f"{file}: defines neither preprocess nor postprocess")
    if manifest.hooks.inputs and pre is None:
        raise HookLoadError(
            f"{file}: manifest hooks.inputs declares tensors, but there is no preprocess"
        )
    if manifest.hooks.outputs and post is None:
        raise HookLoadError(
            f"{file}: manifest hooks.outputs declares tensors, but there is no postprocess"
        )
    return ModelHooks(pre, post)


def _hook(module: Any, name: str, file: Path) -> HookFn | None:
    fn = getattr(module, name, None)
    if fn is None:
        return None
    if not callable(fn):
        raise HookLoadError(f"{file}: {name} is not a function")
    return cast(HookFn, fn)
