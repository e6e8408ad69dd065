"""Policy: an image the nodes cannot pull. The kubelet's words for it (ErrImagePull, then
ImagePullBackOff for as long as the pod lives) name neither the fix nor the field; a user's
first `ddpjob submit` on a real cluster meets it with the default image, which lives in no
registry. The status says in one line which image, which pods, and what to do; one Warning
Event says it once.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ddpjob.api import spec
from ddpjob.api.status import JobStatus, listed, shorten
from ddpjob.controller.observation import DETAIL_LIMIT, LISTED_PODS, PodView
from ddpjob.controller.plan import Event

#: The status reason (and Event reason) while a pod of the attempt waits for its image.
IMAGE_NOT_PULLED = "ImageNotPulled"

#: The kubelet's waiting reasons for an image it has not, and cannot, pull (kubelet images.go).
PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})

#: What to do, in one clause: the ways the image reaches the nodes and the job.
ADVICE = ("push it to a registry the nodes can pull from (make push REGISTRY=...) and set spec.image "
          "(ddpjob submit --image, or DDPJOB_IMAGE), or give the pods spec.imagePullSecrets")


def not_pulled(waiting: Sequence[PodView]) -> list[PodView]:
    """The waiting pods whose container waits for an image the kubelet could not pull."""
    return [p for p in waiting if p.waiting_reason in PULL_REASONS]


def describe(job: spec.DDPJob, pods: Sequence[PodView]) -> Optional[str]:
    """One line for the status: which image, which pods, the kubelet's reason and detail, what
    to do; None when no pod waits for its image."""
    if not pods:
        return None
    first = min(pods, key=lambda p: p.node_rank)
    detail = f": {shorten(first.waiting_message, DETAIL_LIMIT)}" if first.waiting_message else ""
    never = ("; imagePullPolicy is Never, so the image must already be on each node"
             if job.spec.imagePullPolicy == "Never" else "")
    return (f"image {job.spec.image!r} cannot be pulled for "
            f"{listed(sorted(p.name for p in pods), LISTED_PODS)} ({first.waiting_reason}{detail}){never}; "
            f"{ADVICE}")


def event(status: JobStatus, line: str) -> tuple[Event, ...]:
    """The Warning, once: when the job turns to waiting for its image, not on every pass."""
    if status.reason == IMAGE_NOT_PULLED:
        return ()
    return (Event("Warning", IMAGE_NOT_PULLED, shorten(line, DETAIL_LIMIT * 2)),)
