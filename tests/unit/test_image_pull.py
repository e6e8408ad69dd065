"""An image the nodes cannot pull (issue 36 item 1): the status says which image, which pods,
and what to do, in one line; one Warning Event; the startup clock still ends the job."""
from __future__ import annotations

import datetime as dt

import pytest

from ddpjob.api.status import JobStatus, format_time, with_phase
from ddpjob.controller.policy import image_pull
from tests.support.decisions import decide
from tests.support.jobs import make_job, pod_view

pytestmark = pytest.mark.unit
NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
PULL_ERROR = ('failed to pull and unpack image "registry.invalid/me/trainer:1": failed to resolve reference: '
              'dial tcp: lookup registry.invalid: no such host')


def pending(created_ago: float = 30, reason: str = "PodsCreated") -> JobStatus:
    base = JobStatus(nnodes=2, startTime=format_time(NOW - dt.timedelta(seconds=created_ago)))
    status = with_phase(base, "Pending", "PodsCreated", "", NOW - dt.timedelta(seconds=created_ago), created=True)
    return status if reason == "PodsCreated" else with_phase(status, "Pending", reason, "", NOW)


def waiting(rank: int, reason: str, message: str = PULL_ERROR):
    return pod_view(rank, "Pending", created_at=NOW - dt.timedelta(seconds=30), waiting_reason=reason,
                    waiting_message=message)


@pytest.mark.parametrize("reason", sorted(image_pull.PULL_REASONS))
def test_a_pod_waiting_for_its_image_names_the_image_and_the_way_out(reason):
    job = make_job(image="registry.invalid/me/trainer:1")
    plan = decide(job, pending(), [waiting(0, reason), pod_view(1, created_at=NOW)], NOW)
    s = plan.status
    assert (s.phase, s.reason) == ("Pending", "ImageNotPulled"), s
    assert s.message.count("\n") == 0
    assert "image 'registry.invalid/me/trainer:1' cannot be pulled for train-node-0" in s.message
    assert f"({reason}: failed to pull" in s.message
    for way_out in ("spec.image", "--image", "DDPJOB_IMAGE", "make push", "imagePullSecrets"):
        assert way_out in s.message, way_out
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ImageNotPulled")]
    assert "registry.invalid/me/trainer:1" in plan.events[0].message


def test_the_warning_is_said_once_not_on_every_pass():
    job = make_job(image="registry.invalid/me/trainer:1")
    plan = decide(job, pending(reason="ImageNotPulled"), [waiting(0, "ImagePullBackOff"), waiting(1, "ErrImagePull")], NOW)
    assert plan.status.reason == "ImageNotPulled"
    assert "train-node-0 and train-node-1" in plan.status.message or "train-node-0, train-node-1" in plan.status.message
    assert "ImageNotPulled" not in [e.reason for e in plan.events]


def test_other_waiting_reasons_stay_nodes_pending():
    plan = decide(make_job(), pending(), [waiting(0, "ContainerCreating", "")], NOW)
    assert plan.status.reason == "NodesPending" and "cannot be pulled" not in plan.status.message


def test_never_pull_says_the_image_must_be_on_the_node():
    job = make_job(image="me/trainer:1", imagePullPolicy="Never")
    s = decide(job, pending(), [waiting(0, "ErrImageNeverPull", "Container image is not present")], NOW).status
    assert s.reason == "ImageNotPulled" and "must already be on each node" in s.message


def test_the_startup_timeout_still_ends_the_job_and_keeps_the_advice():
    job = make_job(image="registry.invalid/me/trainer:1")
    plan = decide(job, pending(created_ago=601, reason="ImageNotPulled"), [waiting(0, "ImagePullBackOff")], NOW)
    s = plan.status
    assert (s.phase, s.reason) == ("Failed", "StartupTimeout"), s
    assert "cannot be pulled" in s.message and "DDPJOB_IMAGE" in s.message


def test_a_hostile_pull_message_is_cut_to_one_bounded_line():
    job = make_job(image="registry.invalid/me/trainer:1")
    s = decide(job, pending(), [waiting(0, "ErrImagePull", "x" * 100_000)], NOW).status
    assert len(s.message) < 2_000
