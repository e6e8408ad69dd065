"""Progress lines, printed by global rank 0 only, as text or JSON lines.

Text:  ``ddptrain: progress epoch=1/2 step=40/100 loss=2.1034 images_per_sec=812.4 eta_seconds=73``
JSON:  ``{"event": "progress", "epoch": 1, "step": 40, "total_steps": 100, "loss": 2.1034, ...}``

The first line (event ``start``) states world_size, backend and device, so a log grep shows
at once whether every rank joined; the last (event ``done``) has the final step and loss.
Epochs are counted from 1 in what is printed.
"""
from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, Optional, TextIO


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4f}" if key == "loss" else f"{value:.6g}"
    return str(value)


def _text(event: str, fields: dict[str, Any]) -> str:
    """``key=value`` pairs; epoch/epochs and step/total_steps shown as ``epoch=1/3``."""
    totals = {"epoch": "epochs", "step": "total_steps"}
    hidden = {total for key, total in totals.items() if key in fields and total in fields}
    parts = []
    for key, value in fields.items():
        if key in hidden:
            continue
        if key in totals and totals[key] in hidden:
            parts.append(f"{key}={value}/{fields[totals[key]]}")
        else:
            parts.append(f"{key}={_fmt(key, value)}")
    return " ".join(["ddptrain:", event, *parts])


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN
    return value


class Progress:
    def __init__(self, enabled: bool, log_format: str, stream: Optional[TextIO] = None):
        self.enabled = enabled
        self.json = log_format == "json"
        self.stream = stream if stream is not None else sys.stdout

    def emit(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        if self.json:
            record = {"event": event, **{k: _clean(v) for k, v in fields.items()},
                      "time": round(time.time(), 3)}
            line = json.dumps(record)
        else:
            line = _text(event, fields)
        print(line, file=self.stream, flush=True)

    def start(self, **fields: Any) -> None:
        self.emit("start", **fields)

    def note(self, message: str) -> None:
        if self.json:
            self.emit("note", message=message)
        else:
            self.emit(message)

    def progress(self, *, epoch: int, epochs: int, step: int, total_steps: int, loss: float,
                 images_per_sec: float, eta_seconds: float, world_size: int,
                 data_wait_fraction: float) -> None:
        self.emit("progress", epoch=epoch, epochs=epochs, step=step, total_steps=total_steps,
                  loss=loss, images_per_sec=round(images_per_sec, 1),
                  eta_seconds=round(eta_seconds), world_size=world_size,
                  data_wait_fraction=round(data_wait_fraction, 3))


def eta_seconds(steps_left: int, seconds_per_step: float) -> float:
    return max(0.0, steps_left * seconds_per_step)
