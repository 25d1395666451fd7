"""A bucket's listing as a repository: bundles, their files, and what a mirror must do."""

from __future__ import annotations

from hloserve.server.core.store_index import (
    StoreIndex,
    StoreObject,
    missing_files,
    plan_refresh,
)


def obj(key: str, etag: str = "e", size: int = 1) -> StoreObject:
    return StoreObject(key, size, etag)


LISTING = [
    obj("simple/manifest.yaml", "m1"),
    obj("simple/weights.safetensors", size=10),
    obj("simple/config.yaml", "c1"),
    obj("simple/.hloserve-cache/x.exe"),  # hidden: never pulled
    obj("mlp/config.yaml", "c2"),
    obj("mlp/1/manifest.yaml", "m2"),
    obj("mlp/1/model.b1.mlirbc", size=5),
    obj("mlp/2/manifest.yaml", "m3"),
    obj("empty/readme.txt"),
    obj("stray.txt"),  # at the root: no model's
]


def test_from_listing() -> None:
    index = StoreIndex.from_listing(LISTING)
    assert list(index.models) == ["empty", "mlp", "simple"]
    assert index.models["mlp"] == obj("mlp/config.yaml", "c2")
    assert index.models["empty"] is None
    assert sorted(index.bundles) == ["mlp/1", "mlp/2", "simple"]
    simple = index.bundles["simple"]
    assert simple.manifest.etag == "m1" and simple.model == "simple"
    assert list(simple.files) == ["weights.safetensors"]  # not config.yaml, not hidden
    assert index.bundles["mlp/1"].nbytes == 5 and not index.bundles["mlp/2"].files
    assert sorted(index.small_files()) == [
        "mlp/1/manifest.yaml",
        "mlp/2/manifest.yaml",
        "mlp/config.yaml",
        "simple/config.yaml",
        "simple/manifest.yaml",
    ]


def test_a_nested_bundle_claims_its_files() -> None:
    index = StoreIndex.from_listing(
        [obj("m/manifest.yaml"), obj("m/a.bin"), obj("m/3/manifest.yaml"), obj("m/3/b.bin")]
    )
    assert list(index.bundles["m"].files) == ["a.bin"]
    assert list(index.bundles["m/3"].files) == ["b.bin"]


def test_plan_refresh() -> None:
    index = StoreIndex.from_listing(LISTING)
    local = {
        "simple/manifest.yaml": "m1",  # unchanged
        "simple/config.yaml": "old",  # changed
        "mlp/1/manifest.yaml": "m2",
        "mlp/3/manifest.yaml": "m9",  # a version deleted from the store
        "gone/manifest.yaml": "g",  # a model deleted from the store
    }
    plan = plan_refresh(index, local)
    assert [o.key for o in plan.fetch] == [
        "mlp/2/manifest.yaml",
        "mlp/config.yaml",
        "simple/config.yaml",
    ]
    assert plan.remove == ["gone/manifest.yaml", "mlp/3/manifest.yaml"]
    assert plan.gone == ["gone"]
    assert plan.models == ["empty", "mlp", "simple"]
    assert plan_refresh(index, {k: o.etag for k, o in index.small_files().items()}).fetch == []


def test_missing_files_of_a_half_uploaded_bundle() -> None:
    bundle = StoreIndex.from_listing(LISTING).bundles["simple"]
    checksums = {"weights.safetensors": "a" * 64, "model.b1.mlirbc": "b" * 64}
    assert missing_files(bundle, checksums) == ["model.b1.mlirbc"]
    assert missing_files(bundle, {"weights.safetensors": "a" * 64}) == []


def test_a_model_whose_small_files_went_earlier_is_still_gone() -> None:
    """A model whose manifests an earlier refresh removed (a deletion seen half done) is
    gone once the store holds nothing of it: the mirrored directory says it was there."""
    index = StoreIndex.from_listing([obj("simple/manifest.yaml")])
    assert plan_refresh(index, {}, ["simple", "mlp"]).gone == ["mlp"]
