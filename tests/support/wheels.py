"""A pure-Python wheel written by hand (no build backend, no index): what a requirements file of
a test can name and pip install offline."""
from __future__ import annotations

import zipfile
from pathlib import Path


def write_wheel(folder: Path, name: str = "ddpjob_test_greeting", version: str = "0.1",
                code: str = "GREETING = 'hello from a requirement'\n") -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": code,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ddpjob-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path
