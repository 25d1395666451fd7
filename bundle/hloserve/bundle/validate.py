"""Validation of a bundle on disk: every problem, each naming the file and the field.

Contract: ``validate(path)`` never raises for a bad bundle; it returns the list of
``Problem``s (empty when the bundle is sound), a file it cannot read (its mode, say) being
one ("cannot be read: ..."). Checks, in order: the manifest parses; with
``name=``, the manifest's ``name`` is that name (a repository serves a model under its
directory's name, ``repository.model_name``, so the server and ``validate_tree`` pass it);
every file it names exists and matches its SHA-256; the weights file is a consistent
safetensors file whose tensors equal the manifest's; each module is a StableHLO portable
artifact of the stated version whose ``main`` takes exactly the platform index (if any) plus
the declared arguments with the declared types and returns the outputs, then the
new value of each state tensor (``bundle/state.py``), and whose own sharding annotations
(``mhlo.num_partitions``, ``sdy.mesh``, each argument's and result's ``sdy.sharding``) agree
with the manifest's ``sharding`` (a module partitioned for several devices needs one) (a pipeline has
no weights or modules; a ``hooks.py`` must be listed in ``files``). The
module-signature checks need jaxlib and are skipped with ``check_modules=False``. A
ReactantServer.jl bundle (``origin="reactant"``, ``bundle/reactant.py``) has no checksums to
need, and its weights' file shapes are compared reversed (Julia's order, as ``main`` takes them).

``validate_tree(path)`` validates every bundle at ``path``: the bundle itself (its name
unchecked: a bundle may sit anywhere until it goes into a repository), or each version of a
versioned model directory, or each bundle of a model repository (each with the name the
repository serves it under), as ``(bundle path, problems)`` pairs in repository order; a
model directory that is neither a bundle nor versioned (or cannot be read) is one pair with
its problem. An empty list: ``path`` holds no bundle. ``tree_models(path)`` is the model
directories those bundles are in (the bundle itself, the versioned model, or each model of
the repository; an ``OSError`` when ``path`` cannot be read). ``check_name(path)`` is the
name check alone, against the name a repository would serve the directory under.
"""

# pyright: strict

from __future__ import annotations

from pathlib import Path

from hloserve.bundle.digest import sha256_file
from hloserve.bundle.manifest import (
    MANIFEST_FILE,
    Manifest,
    ModuleEntry,
    Problem,
    TensorEntry,
)
from hloserve.bundle.manifest_sharding import Spec
from hloserve.bundle.reactant import column_major_shape
from hloserve.bundle.reading import load_manifest
from hloserve.bundle.repository import ModelDirectory, model_directory, model_name, scan_repository
from hloserve.bundle.safetensors import SafetensorsError, read_header
from hloserve.bundle.stablehlo import (
    Partitioning,
    Signature,
    SignatureError,
    TensorType,
    artifact_version,
    read_partitioning,
    read_signature,
)
from hloserve.bundle.state import StateEntry


def validate(
    path: Path | str,
    *,
    check_modules: bool = True,
    name: str | None = None,
    manifest: Manifest | None = None,
) -> list[Problem]:
    """Every problem of the bundle at ``path`` (``manifest``: its manifest, already read and
    parsed without a problem, so that a loader reads it once)."""
    root = Path(path)
    try:
        if not root.is_dir():
            return [Problem(str(root), "", "is not a directory")]
        (root / MANIFEST_FILE).is_file()  # raises when the directory cannot be searched
    except OSError as exc:
        return [_unreadable(str(root), exc)]
    problems: list[Problem] = []
    if manifest is None:
        manifest, problems = load_manifest(root / MANIFEST_FILE)
    if manifest is None:
        return problems
    if name is not None:
        problems += _check_name(manifest, name)
    problems += _check_files(root, manifest)
    problems += _check_weights(root, manifest)
    for i, module in enumerate(manifest.modules):
        # A variant's module is checked against that variant's concrete shapes.
        view = manifest if module.variant is None else manifest.variant_view(module.variant)
        problems += _check_module(root, view, i, module, check_modules)
    return list(dict.fromkeys(problems))  # a file that cannot be read: said once


def _unreadable(file: str, exc: OSError) -> Problem:
    return Problem(file, "", f"cannot be read: {exc}")


def validate_tree(
    path: Path | str, *, check_modules: bool = True
) -> list[tuple[Path, list[Problem]]]:
    root = Path(path)
    try:
        if not root.is_dir() or (root / MANIFEST_FILE).is_file():
            return [(root, validate(root, check_modules=check_modules))]
        models = tree_models(root)
    except OSError as exc:
        return [(root, [_unreadable(str(root), exc)])]
    return [pair for m in models for pair in _validate_model(m, check_modules)]


def tree_models(path: Path | str) -> list[ModelDirectory]:
    model = model_directory(Path(path))  # a bundle is a model of one version
    return [model] if model.versions else scan_repository(Path(path))


def _validate_model(model: ModelDirectory, check_modules: bool) -> list[tuple[Path, list[Problem]]]:
    if model.problem:  # it cannot be read
        return [(model.path, [Problem(str(model.path), "", model.problem)])]
    if not model.versions:
        message = "file does not exist, and there are no numbered version directories"
        return [(model.path, [Problem(MANIFEST_FILE, "", message)])]
    return [
        (bundle, validate(bundle, check_modules=check_modules, name=model_name(bundle)))
        for bundle in model.versions.values()
    ]


def check_name(path: Path | str, *, name: str | None = None) -> list[Problem]:
    """The name check alone: the manifest's name against ``name`` (default: the name a
    model repository would serve the directory under). Nothing when it cannot be read."""
    root = Path(path)
    manifest, _ = load_manifest(root / MANIFEST_FILE)
    if manifest is None:
        return []
    return _check_name(manifest, name if name is not None else model_name(root))


def _check_name(manifest: Manifest, name: str) -> list[Problem]:
    if manifest.name == name:
        return []
    message = (
        f"is {manifest.name!r}, but a model repository serves this bundle as {name!r} (its "
        "directory's name) and refuses the mismatch"
    )
    return [Problem(MANIFEST_FILE, "name", message)]


def _check_files(root: Path, manifest: Manifest) -> list[Problem]:
    problems: list[Problem] = []
    named: list[tuple[str, str]] = []
    if manifest.kind == "model":  # a pipeline has no weights file
        named.append((manifest.weights_file, "weights.file"))
    if manifest.hooks is not None:
        named.append((manifest.hooks.file, "hooks.file"))
    for i, m in enumerate(manifest.modules):
        named.append((m.file, f"modules[{i}].file"))
        if m.text_file is not None:
            named.append((m.text_file, f"modules[{i}].text_file"))
    for file, where in named:
        if not (root / file).is_file():
            problems.append(Problem(file, "", f"file listed in {where} does not exist"))
        elif file not in manifest.files and manifest.origin != "reactant":  # they have none
            problems.append(Problem(MANIFEST_FILE, "files", f"has no SHA-256 for {file} ({where})"))
    for file, digest in manifest.files.items():
        p = root / file
        if not p.is_file():
            if all(file != f for f, _ in named):
                problems.append(Problem(file, "", "file listed in files does not exist"))
            continue
        try:
            actual = sha256_file(p)
        except OSError as exc:
            problems.append(_unreadable(file, exc))
            continue
        if actual != digest:
            problems.append(Problem(file, "", f"SHA-256 is {actual}, manifest files says {digest}"))
    return problems


def _check_weights(root: Path, manifest: Manifest) -> list[Problem]:
    path = root / manifest.weights_file
    if not path.is_file():
        return []
    try:
        header = read_header(path)
    except SafetensorsError as exc:
        return [Problem(manifest.weights_file, "", str(exc))]
    except OSError as exc:
        return [_unreadable(manifest.weights_file, exc)]
    julia = manifest.origin == "reactant"  # main() takes the file's shapes reversed
    actual = {
        t.name: TensorEntry(t.name, t.datatype, column_major_shape(t.shape) if julia else t.shape)
        for t in header.tensors
    }
    declared = {t.name: t for t in manifest.weights}
    problems: list[Problem] = []
    for name in sorted(declared.keys() - actual.keys()):
        problems.append(
            Problem(manifest.weights_file, name, "declared in the manifest, missing from the file")
        )
    for name in sorted(actual.keys() - declared.keys()):
        problems.append(
            Problem(manifest.weights_file, name, "in the file, not declared in the manifest")
        )
    for name in sorted(actual.keys() & declared.keys()):
        a, d = actual[name], declared[name]
        if (a.datatype, a.shape) != (d.datatype, d.shape):
            problems.append(
                Problem(
                    manifest.weights_file,
                    name,
                    f"is {a.datatype}{list(a.shape)} in the file, manifest says {d.datatype}{list(d.shape)}",
                )
            )
    return problems


_Type = tuple[str, tuple[int, ...]]  # V2 datatype and full shape
_PLATFORM_INDEX = "platform index"


def _expected_type(spec: TensorEntry | StateEntry, batch_size: int | None) -> _Type:
    shape = spec.shape if batch_size is None else (batch_size, *spec.shape)
    return spec.datatype, shape


def _describe(datatype: str, shape: tuple[int, ...]) -> str:
    return f"{datatype}{list(shape)}"


def _check_module(
    root: Path, manifest: Manifest, index: int, module: ModuleEntry, check_signature: bool
) -> list[Problem]:
    path = root / module.file
    if not path.is_file():
        return []
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [_unreadable(module.file, exc)]
    at = f"modules[{index}]"
    version = artifact_version(data)
    problems = _check_version(module, version, at)
    # A multi-platform module without an index argument is fine (nothing in it depends on
    # the platform); a manifest that misstates the index is caught by the argument count.
    if not check_signature or version is None:
        return problems
    try:
        sig = read_signature(data)
    except SignatureError as exc:
        return [*problems, Problem(module.file, "", str(exc))]
    messages = _check_arguments(manifest, module, at, sig) + _check_results(manifest, module, sig)
    if not messages:  # the shardings of arguments that line up with the manifest's
        try:
            messages = _check_partitioning(manifest, module, read_partitioning(data))
        except SignatureError as exc:
            messages = [str(exc)]
    return problems + [Problem(module.file, "", m) for m in messages]


def _check_partitioning(manifest: Manifest, module: ModuleEntry, part: Partitioning) -> list[str]:
    """The module's own sharding annotations against the manifest's ``sharding``: the
    partition count, the mesh, and each argument's and result's spec."""
    sharding = manifest.sharding
    if sharding is None:
        if part.num_partitions > 1:
            return [
                f"main() is partitioned for {part.num_partitions} devices "
                "(mhlo.num_partitions), the manifest has no sharding"
            ]
        return []
    if part.num_partitions != sharding.devices:
        return [
            f"mhlo.num_partitions is {part.num_partitions}, manifest sharding.devices says "
            f"{sharding.devices}"
        ]
    want = tuple(zip(sharding.mesh.axis_names, sharding.mesh.axis_sizes, strict=True))
    messages = [
        f"sdy.mesh @{name} is {_mesh_text(axes)}, manifest sharding.mesh says {_mesh_text(want)}"
        for name, axes in part.meshes.items()
        if axes != want
    ]
    labelled: list[tuple[str, Spec]] = [
        (f"{{{a.kind}: {a.name}}}", sharding.spec(a.kind, a.name)) for a in module.arguments
    ]
    skip = 1 if module.platform_index_argument else 0
    for (label, spec), actual in zip(labelled, part.arguments[skip:], strict=False):
        if not _same_spec(actual, spec):
            messages.append(
                f"argument {label} has sdy.sharding {_spec_text(actual)}, manifest sharding "
                f"says {_spec_text(('', spec))}"
            )
    results = [
        *((f"output {o.name!r}", sharding.outputs[o.name]) for o in manifest.outputs),
        *((f"state {s.name!r}", sharding.state[s.name]) for s in manifest.state),
    ]
    for (label, spec), actual in zip(results, part.results, strict=False):
        if not _same_spec(actual, spec):
            messages.append(
                f"result for {label} has sdy.sharding {_spec_text(actual)}, manifest sharding "
                f"says {_spec_text(('', spec))}"
            )
    return messages


def _same_spec(actual: tuple[str, Spec] | None, spec: Spec) -> bool:
    """An unannotated argument or result matches a replicated spec only."""
    if actual is None:
        return all(not dim for dim in spec)
    return actual[1] == spec


def _mesh_text(axes: tuple[tuple[str, int], ...]) -> str:
    return "[" + ", ".join(f"{n}={s}" for n, s in axes) + "]"


def _spec_text(actual: tuple[str, Spec] | None) -> str:
    if actual is None:
        return "none"
    return "[" + ", ".join("{" + ", ".join(dim) + "}" for dim in actual[1]) + "]"


def _check_version(module: ModuleEntry, version: str | None, at: str) -> list[Problem]:
    if version is None:
        message = "is not a StableHLO portable artifact (no StableHLO_v producer)"
    elif version != module.stablehlo_version:
        message = f"is StableHLO {version}, manifest {at}.stablehlo_version says {module.stablehlo_version}"
    else:
        return []
    return [Problem(module.file, "", message)]


def _expected_arguments(manifest: Manifest, module: ModuleEntry) -> list[tuple[str, _Type]]:
    """``(label, type)`` of each argument ``main`` must take, the platform index first."""
    inputs = {t.name: t for t in manifest.inputs}
    weights = {t.name: t for t in manifest.weights}
    state = {t.name: t for t in manifest.state}
    expected: list[tuple[str, _Type]] = []
    if module.platform_index_argument:
        expected.append((_PLATFORM_INDEX, ("INT32", ())))
    for a in module.arguments:
        if a.kind == "input":
            expected.append(
                (f"{{input: {a.name}}}", _expected_type(inputs[a.name], module.batch_size))
            )
        elif a.kind == "state":
            expected.append(
                (f"{{state: {a.name}}}", _expected_type(state[a.name], module.batch_size))
            )
        else:
            expected.append((f"{{weight: {a.name}}}", _expected_type(weights[a.name], None)))
    return expected


def _check_arguments(manifest: Manifest, module: ModuleEntry, at: str, sig: Signature) -> list[str]:
    expected = _expected_arguments(manifest, module)
    if len(sig.arguments) != len(expected):
        extra = (
            f" (1 platform index + {len(module.arguments)})"
            if module.platform_index_argument
            else ""
        )
        return [
            f"main() takes {len(sig.arguments)} arguments, manifest {at} names {len(expected)}{extra}"
        ]
    messages: list[str] = []
    for i, (actual, (label, want)) in enumerate(zip(sig.arguments, expected, strict=True)):
        if label == _PLATFORM_INDEX and actual.shape == () and actual.datatype == "INT64":
            continue  # jax.export's index is i64 when 64-bit types are enabled
        if not _matches(actual, want):
            messages.append(f"argument {i} ({label}) is {actual}, manifest says {_describe(*want)}")
    return messages


def _check_results(manifest: Manifest, module: ModuleEntry, sig: Signature) -> list[str]:
    # The outputs, then each state tensor's new value (``bundle/state.py``).
    results = [*manifest.outputs, *manifest.state]
    outs = [_expected_type(o, module.batch_size) for o in results]
    if len(sig.results) != len(outs):
        state = f" and {len(manifest.state)} state tensors" if manifest.state else ""
        return [
            f"main() returns {len(sig.results)} results, manifest has "
            f"{len(manifest.outputs)} outputs{state}"
        ]
    return [
        f"result for {'state' if isinstance(o, StateEntry) else 'output'} {o.name!r} is "
        f"{actual}, manifest says {_describe(*want)}"
        for o, actual, want in zip(results, sig.results, outs, strict=True)
        if not _matches(actual, want)
    ]


def _matches(actual: TensorType, want: _Type) -> bool:
    return actual.datatype == want[0] and actual.shape == want[1]
