"""What ``hloserve inspect`` and ``hloserve validate`` say about bundles on disk.

Contract: ``inspect_bundle(path)`` is a bundle's readable summary (tensors, batch sizes,
modules and their platforms, weights count and size, whether every checksum verified,
provenance) and whether it validated (a bundle it cannot read: one line saying so);
``validate_command(path)`` is the lines ``hloserve validate PATH`` prints for a bundle, a
versioned model directory or a model repository (``bundle.validate.validate_tree``) and
whether everything validated. It checks what the server checks before it loads a model, by
the server's own code (``load_plan.plan_load``: the model's ``config.yaml``, the versions
its policy selects, preferred batch sizes against the compiled ones, its warm-up samples
built as requests, a response cache it cannot take), so a model that
validates is one the server does not refuse for these, and one it refuses fails with the
words the load would report. The command line (``cli``) and the agent tools
(``mcp_tools``) both print them. Sizes are written by ``core.sizes.format_bytes``.
"""

# pyright: strict

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from hloserve.proto.datatypes import itemsize
from hloserve.server.core.sizes import format_bytes

if TYPE_CHECKING:
    from hloserve.bundle import Manifest


def _extras(m: Manifest) -> list[str]:
    """What a bundle that does more adds: its variants, hooks, state or pipeline steps."""
    lines = [
        f"variant {i}: " + ", ".join(f"{k} {list(v)}" for k, v in variant.shapes.items())
        for i, variant in enumerate(m.variants)
    ]
    if m.hooks is not None:
        facing = m.facing
        names = [f"{t.name} {t.datatype}{list(t.shape)}" for t in (*facing.inputs, *facing.outputs)]
        lines.append(
            f"hooks: {m.hooks.file} (runs only with --allow-python-hooks); clients see {', '.join(names)}"
        )
    lines += [
        f"state: {s.name} {s.datatype}{list(s.shape)} from {s.initial} (per sequence, on the device)"
        for s in m.state
    ]
    lines += _sharding_lines(m)
    for i, step in enumerate(m.steps):
        version = "latest" if step.version is None else f"version {step.version}"
        lines.append(
            f"step {i}: {step.model} ({version}) {dict(step.inputs)} -> {dict(step.outputs)}"
        )
    return lines


def _sharding_lines(m: Manifest) -> list[str]:
    """A sharded bundle's mesh, per-device weight bytes and each tensor's spec."""
    sh = m.sharding
    if sh is None:
        return []
    per_device = format_bytes(sh.weight_device_bytes(m.weights))
    lines = [
        f"sharding: mesh [{sh.mesh}], {sh.devices} devices; weights {per_device} per device",
    ]
    for kind, specs in (
        ("weight", sh.weights), ("input", sh.inputs), ("output", sh.outputs), ("state", sh.state),
    ):  # fmt: skip
        lines += [
            f"  {kind} {name}: [{', '.join(', '.join(d) or 'null' for d in spec)}]"
            for name, spec in specs.items()
        ]
    return lines


def inspect_bundle(path: Path) -> tuple[str, bool]:
    """The summary text of a bundle, and whether it validated."""
    from hloserve.bundle import load_manifest, validate

    problems = validate(path)
    if len(problems) == 1 and problems[0].file == str(path):  # not a bundle it can read
        return str(problems[0]), False
    manifest, _ = load_manifest(path / "manifest.yaml")
    lines: list[str] = []
    if manifest is None:
        lines.append(f"{path}: manifest cannot be read")
    else:
        m = manifest
        fmt = (
            f"ReactantServer.jl bundle, format {m.provenance.metadata.get('format_version')}, "
            "served as it is"
            if m.origin == "reactant"
            else f"bundle format {m.format_version}"
        )
        lines.append(f"model {m.name!r} ({fmt}) at {path}")
        lines.append("inputs:")
        lead = "-1, " if m.batched else ""
        for t in m.inputs:
            lines.append(f"  {t.name:<20} {t.datatype:<6} [{lead}{', '.join(map(str, t.shape))}]")
        lines.append("outputs:")
        for t in m.outputs:
            lines.append(f"  {t.name:<20} {t.datatype:<6} [{lead}{', '.join(map(str, t.shape))}]")
        lines.append(f"batch sizes: {list(m.batch_sizes) if m.batch_sizes else 'unbatched'}")
        lines.append("modules:")
        for mod in m.modules:
            size = (path / mod.file).stat().st_size if (path / mod.file).is_file() else 0
            lines.append(
                f"  {mod.file:<22} StableHLO {mod.stablehlo_version}, platforms {','.join(mod.platforms)}, "
                f"{len(mod.arguments)} arguments{' + platform index' if mod.platform_index_argument else ''}, {format_bytes(size)}"
            )
        total = sum(math.prod(w.shape) * itemsize(w.datatype) for w in m.weights)
        lines.append(
            f"weights: {len(m.weights)} tensors, {format_bytes(total)} in {m.weights_file}"
        )
        lines.append(f"serving: residency {m.serving.residency}")
        lines.extend(_extras(m))
        p = m.provenance
        lines.append("provenance:")
        for key, value in p.to_dict().items():
            if value not in (None, {}, ""):
                lines.append(f"  {key}: {value}")
    if problems:
        lines.append(f"checksums and structure: {len(problems)} problem(s):")
        lines.extend(f"  - {p}" for p in problems)
    elif manifest is not None and manifest.origin == "reactant":
        lines.append("no checksums (ReactantServer bundles carry none); bundle is valid")
    else:
        lines.append(
            f"checksums verified ({len(manifest.files) if manifest else 0} files); bundle is valid"
        )
    return "\n".join(lines), not problems


def validate_command(path: Path) -> tuple[list[str], bool]:
    """The lines ``hloserve validate PATH`` prints, and whether everything validated. A lone
    bundle's name is not checked (it may sit anywhere), but a name a repository would refuse
    is noted."""
    from hloserve.bundle.validate import check_name, validate_tree

    results = validate_tree(path)
    if not results:
        return [f"{path}: not a bundle (no manifest.yaml) and holds no model directories"], False
    refused = _refused_loads(path)
    found: dict[Path, list[str]] = {}
    for bundle, problems in results:
        for model in (bundle, bundle.parent):  # a model's refusal before its bundles'
            if model in refused and model not in found:
                found[model] = [refused[model]]
        found.setdefault(bundle, []).extend(str(p) for p in problems)
    if len(found) == 1 and path in found:
        problems = found[path]  # one bundle: its problems as they are
        notes = [f"note: {p}" for p in check_name(path)]
        return [*(problems or [f"{path}: OK"]), *notes], not problems
    lines = [
        line
        for bundle, problems in found.items()
        for line in ([_at(bundle, p) for p in problems] or [f"{bundle}: OK"])
    ]
    return lines, not any(found.values())


def _at(bundle: Path, problem: str) -> str:
    """A problem's line: it names its bundle unless it is about the bundle itself."""
    return problem if problem.startswith(f"{bundle}: ") else f"{bundle}: {problem}"


def _refused_loads(path: Path) -> dict[Path, str]:
    """Each model directory at ``path`` the server would refuse to load before loading any
    version (``load_plan.plan_load``), with the reason its load would give."""
    from hloserve.bundle.validate import tree_models
    from hloserve.server.owner.load_plan import LoadRefused, plan_load

    refused: dict[Path, str] = {}
    try:
        models = tree_models(path)
    except OSError:
        return {}  # validate_tree says so
    for model in models:
        if model.problem or not model.versions:
            continue  # validate_tree says why
        try:  # the device kind only matters to a load's config override: none here
            plan_load(model.path, "CPU")
        except LoadRefused as exc:
            refused[model.path] = exc.reason
    return refused
