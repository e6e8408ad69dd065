"""The image ``ddpjob submit`` gives the pods when ``--image`` is not said, set once per user or
shell rather than on every command: the built-in default (what ``make images`` builds, under
``localhost/``) exists on no cluster's registry, so a real cluster needs the user's own.

First that is set wins: ``--image``; the environment's ``DDPJOB_IMAGE``; ``image:`` in the config
file (``$DDPJOB_CONFIG``, else ``$XDG_CONFIG_HOME/ddpjob/config.yaml``, else
``~/.config/ddpjob/config.yaml``); the built-in default.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from ddpjob.client.submission import DEFAULT_IMAGE

IMAGE_ENV = "DDPJOB_IMAGE"
CONFIG_ENV = "DDPJOB_CONFIG"
#: The config file's keys, and what each is.
CONFIG_KEYS = {"image": "the pods' image when --image is not given"}
# A config file is a few lines; anything larger is not one (and is not read whole).
CONFIG_LIMIT = 64 * 1024
IMAGE_LIMIT = 512  # spec.image's maxLength


class UserConfigError(ValueError):
    """A config file or variable that cannot be used: one line naming it and what is allowed."""


def config_path(environ: Mapping[str, str]) -> Path:
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(base) / "ddpjob" / "config.yaml"


def read_config(path: Path, required: bool) -> dict[str, str]:
    """The config file's settings; {} when there is none (an error when ``required``: a file
    named by DDPJOB_CONFIG that is not there is a mistake, not a default)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(CONFIG_LIMIT + 1)
    except FileNotFoundError:
        if required:
            raise UserConfigError(f"{CONFIG_ENV}={path}: no such file") from None
        return {}
    except OSError as error:
        raise UserConfigError(f"config file {path}: cannot be read ({error.strerror or error})") from None
    if len(raw) > CONFIG_LIMIT:
        raise UserConfigError(f"config file {path}: larger than {CONFIG_LIMIT // 1024} KiB; it holds a few keys "
                              f"({', '.join(CONFIG_KEYS)})")
    import yaml

    try:
        data = yaml.safe_load(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        where = getattr(error, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise UserConfigError(f"config file {path}: not YAML{line}; expected lines like `image: my.registry/trainer:1`"
                              ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserConfigError(f"config file {path}: expected a mapping (`image: ...`), found a {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in CONFIG_KEYS)
    if unknown:
        allowed = "; ".join(f"{k}: {what}" for k, what in CONFIG_KEYS.items())
        raise UserConfigError(f"config file {path}: unknown key {', '.join(unknown)}; allowed: {allowed}")
    settings = {}
    for key, value in data.items():
        if not isinstance(value, str) or not value.strip():
            raise UserConfigError(f"config file {path}: {key} must be a non-empty string")
        settings[key] = value.strip()
    return settings


def _checked_image(image: str, where: str) -> str:
    if len(image) > IMAGE_LIMIT or any(c.isspace() for c in image):
        raise UserConfigError(f"{where}: an image reference has no spaces and at most {IMAGE_LIMIT} characters")
    return image


def default_image(environ: Optional[Mapping[str, str]] = None) -> tuple[str, str]:
    """(the image, where it came from) when --image is not given."""
    environ = os.environ if environ is None else environ
    if environ.get(IMAGE_ENV, "").strip():
        return _checked_image(environ[IMAGE_ENV].strip(), IMAGE_ENV), IMAGE_ENV
    path = config_path(environ)
    settings = read_config(path, required=bool(environ.get(CONFIG_ENV)))
    if "image" in settings:
        return _checked_image(settings["image"], f"config file {path}: image"), f"config file {path}"
    return DEFAULT_IMAGE, "the built-in default"
