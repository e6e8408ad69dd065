"""Parsed DDPJobs and pod views, built directly (no YAML, no validation) for pure tests."""
from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from ddpjob.api import spec
from ddpjob.controller.decide import PodView

UID = "uid-job"


def make_job(nnodes: int = 2, *, name: str = "train", namespace: str = "ns",
             uid: Optional[str] = UID, image: str = "img", **spec_fields: Any) -> spec.DDPJob:
    """A DDPJob with ``spec_fields`` over the model's defaults (nested fields as dataclasses)."""
    return spec.DDPJob(name=name, namespace=namespace, uid=uid,
                       spec=spec.DDPJobSpec(nnodes=nnodes, image=image, **spec_fields))


def pod_view(rank: int, phase: str = "Running", attempt: int = 0, *, job: str = "train",
             owner_uid: str = UID, created_at: Optional[dt.datetime] = None, **fields: Any) -> PodView:
    """What the operator's pod index holds for node ``rank`` of ``attempt``."""
    values: dict[str, Any] = dict(name=f"{job}-node-{rank}", uid=f"uid-{attempt}-{rank}",
                                  node_rank=rank, attempt=attempt, owner_uid=owner_uid, phase=phase,
                                  running=phase == "Running")
    if created_at is not None:
        values["created_at"] = created_at
    values.update(fields)
    return PodView(**values)
