"""``python -m ddpjob.api.generate`` (``make generate``): write every file generated from the API
model, manifests/crd.yaml and docs/api.md; ``--check`` only reports which differ (exit 1).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional

from ddpjob.api import crd, docs

# Repository path -> what generates it.
GENERATED: dict[str, Callable[[], str]] = {
    "manifests/crd.yaml": crd.crd_yaml,
    "docs/api.md": docs.api_markdown,
}


def stale_files(root: Path) -> list[str]:
    """The generated files under ``root`` whose text differs from what the model generates."""
    return [rel for rel, make in GENERATED.items()
            if not (root / rel).is_file() or (root / rel).read_text() != make()]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpjob.api.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="the repository root (default: .)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    root = Path(args.root)
    stale = stale_files(root)
    if args.check:
        for rel in stale:
            print(f"{rel} is stale: run make generate", file=sys.stderr)
        return 1 if stale else 0
    for rel in stale:
        (root / rel).write_text(GENERATED[rel]())
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
