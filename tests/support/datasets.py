"""Tiny data sets in their real on-disk formats, for torchvision's real readers."""
from __future__ import annotations

import pickle
from pathlib import Path

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck"]


def write_mnist(root: Path, n_train: int = 64, n_test: int = 16) -> Path:
    """MNIST as big-endian idx files under ``<root>/MNIST/raw/``."""
    import numpy as np

    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        # idx magic: two zero bytes, the type (0x08 = unsigned byte), the number of dimensions
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            np.array([0x0803, n, 28, 28], dtype=">u4").tobytes() + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            np.array([0x0801, n], dtype=">u4").tobytes() + labels.tobytes())
    return Path(root)


def write_cifar10(root: Path, per_batch: int = 4) -> Path:
    """The 'CIFAR-10 python version': pickled dicts, rows of 3072 bytes (R, G, B planes)."""
    import numpy as np

    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"batch_label": name, "labels": [i % 10 for i in range(per_batch)],
                 "data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
                 "filenames": [f"{name}-{i}.png" for i in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {"label_names": CIFAR10_CLASSES, "num_cases_per_batch": per_batch, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return Path(root)
