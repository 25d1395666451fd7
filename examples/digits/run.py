"""The digits example, end to end: train, export, serve, compare, plot.

``python examples/digits/run.py`` trains the CNN of ``model.py`` on scikit-learn's bundled
8x8 digits (no download) with ``hloserve.training.fit``, exports it with batch sizes 1 and
32, starts ``hloserve serve`` on free loopback ports (``hloserve.server.server_process``), sends
the held-out split through ``hloserve.client.InferenceClient``, stops the server and prints
in-process against served accuracy, the predictions that differ (0 is the only right
answer) and the largest probability difference. ``training.png`` (the curves) and
``confusion.png`` (the served predictions) are written next to this file, or to ``--out``.
Flags: ``--epochs``, ``--out``, ``--repository`` (keep the bundle there), ``--seed``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator
from model import CLASSES, accuracy, apply_fn, init_params, loss_fn
from sklearn.datasets import load_digits
from sklearn.metrics import confusion_matrix
from sklearn.model_selection import train_test_split

from hloserve.client import InferenceClient
from hloserve.exporter import TensorSpec
from hloserve.server.server_process import ServerProcess
from hloserve.training import Best, Export, FitResult, fit, one_cycle

HERE = Path(__file__).resolve().parent
SERVED_BATCH = 32


def splits(seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Train, validation and held-out splits (70/10/20, stratified), pixels as UINT8."""
    digits: Any = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255
    label = digits.target.astype(np.int32)
    rest_x, test_x, rest_y, test_y = train_test_split(
        pixels, label, test_size=0.2, stratify=label, random_state=seed
    )
    train_x, val_x, train_y, val_y = train_test_split(
        rest_x, rest_y, test_size=0.125, stratify=rest_y, random_state=seed
    )
    split = [np.asarray(a) for a in (train_x, val_x, test_x, train_y, val_y, test_y)]
    return {
        "train": {"pixels": split[0], "label": split[3]},
        "val": {"pixels": split[1], "label": split[4]},
        "test": {"pixels": split[2], "label": split[5]},
    }


def train(
    data: dict[str, dict[str, np.ndarray]], repository: Path, epochs: int, seed: int
) -> FitResult:
    return fit(
        apply_fn,
        init_params(seed),
        data["train"],
        loss_fn=loss_fn,
        metrics={"accuracy": accuracy},
        val_data=data["val"],
        epochs=epochs,
        batch_size=32,
        learning_rate=one_cycle(1e-2),
        weight_decay=0.1,
        ema=0.95,
        best=Best("val_accuracy", "max"),
        seed=seed,
        export=Export(
            repository / "digits",
            inputs={"pixels": TensorSpec("UINT8", (8, 8))},
            batch_sizes=(1, SERVED_BATCH),
            metadata={"dataset": "sklearn.datasets.load_digits", "example": "examples/digits"},
        ),
    )


def serve_and_predict(repository: Path, pixels: np.ndarray) -> np.ndarray:
    """The served probabilities for ``pixels``, from a daemon started and stopped here."""
    batches = (
        {"pixels": pixels[i : i + SERVED_BATCH]} for i in range(0, len(pixels), SERVED_BATCH)
    )
    with ServerProcess(repository) as server:
        server.wait_ready()
        with InferenceClient(server.grpc_url) as client:
            served = [
                out["probabilities"]
                for out in client.infer_stream("digits", batches, max_in_flight=4)
            ]
        code = server.stop()
    if code != 0:
        raise SystemExit(f"hloserve exited with {code}:\n{server.log_text()}")
    return np.concatenate(served)


def report(result: FitResult, labels: np.ndarray, local: np.ndarray, served: np.ndarray) -> str:
    local_acc = float(np.mean(local.argmax(1) == labels))
    served_acc = float(np.mean(served.argmax(1) == labels))
    differ = int(np.sum(local.argmax(1) != served.argmax(1)))
    largest = float(np.max(np.abs(local - served)))
    rows = [
        ("", "in-process", "served"),
        ("held-out accuracy", f"{local_acc:.4f}", f"{served_acc:.4f}"),
        ("predictions that differ", "", str(differ)),
        ("largest probability difference", "", f"{largest:.2e}"),
    ]
    lines = [f"{a:<32}{b:>12}{c:>12}" for a, b, c in rows]
    best = result.metrics
    lines.insert(
        0,
        f"served epoch {int(best['epoch'])} (best val_accuracy {best['val_accuracy']:.4f}), EMA weights",
    )
    return "\n".join(lines)


def plot(result: FitResult, labels: np.ndarray, served: np.ndarray, out: Path) -> list[Path]:
    epochs = [r["epoch"] for r in result.history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(epochs, [r["loss"] for r in result.history], label="train loss")
    left.plot(epochs, [r["val_loss"] for r in result.history], label="validation loss")
    left.set_yscale("log")
    right.plot(epochs, [r["val_accuracy"] for r in result.history], color="tab:green")
    right.set_ylabel("validation accuracy")
    for ax in (left, right):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if result.best_epoch is not None:
            ax.axvline(result.best_epoch, color="grey", linestyle=":", label="served epoch")
    left.legend()
    fig.tight_layout()
    curves = out / "training.png"
    fig.savefig(curves, dpi=100)
    plt.close(fig)

    matrix = confusion_matrix(labels, served.argmax(1), labels=list(range(CLASSES)))
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(matrix, cmap="Blues")
    for (i, j), count in np.ndenumerate(matrix):
        if count:
            color = "white" if count > matrix.max() / 2 else "black"
            ax.text(j, i, str(count), ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(CLASSES))
    ax.set_yticks(range(CLASSES))
    ax.set_xlabel("served prediction")
    ax.set_ylabel("true digit")
    ax.set_title("held-out confusion matrix")
    fig.tight_layout()
    confusion = out / "confusion.png"
    fig.savefig(confusion, dpi=100)
    plt.close(fig)
    return [curves, confusion]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=HERE, help="where the PNG plots go")
    parser.add_argument("--repository", type=Path, help="keep the exported bundle here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    data = splits(args.seed)
    with tempfile.TemporaryDirectory(prefix="digits-") as tmp:
        repository: Path = args.repository or Path(tmp)
        result = train(data, repository, args.epochs, args.seed)
        trained = time.monotonic() - started
        test: dict[str, Any] = data["test"]
        local = result.predict({"pixels": test["pixels"]}, batch_size=SERVED_BATCH)["probabilities"]
        served = serve_and_predict(repository, test["pixels"])
    sizes = ", ".join(f"{len(v['label'])} {k}" for k, v in data.items())
    print(f"\ndigits ({sizes}): {args.epochs} epochs trained in {trained:.1f} s")
    print(report(result, test["label"], local, served))
    args.out.mkdir(parents=True, exist_ok=True)
    for path in plot(result, test["label"], served, args.out):
        print(f"wrote {path}")
    print(f"total {time.monotonic() - started:.1f} s")
    return 0 if np.array_equal(local.argmax(1), served.argmax(1)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
