"""The API server's own verdict on the biggest status the operator can write (issue 21, item
14; docs/operator.md, "How big a status gets"): every field at its bound, 64 nodes listed, the
rank sets of a 9,999-node gang at their longest. tests/unit/test_status.py measures it; here the
real API server (and etcd behind it) stores it."""
from __future__ import annotations

import json

import pytest

from ddpjob.api import names
from tests.support.status_bounds import STATUS_BUDGET, worst_valid

from .e2e_support import ddpjob_manifest, e2e, python_command  # noqa: F401 - e2e is a fixture

pytestmark = pytest.mark.cluster


def test_the_worst_status_is_stored_by_the_api_server(e2e):
    name = "biggest-status"
    # Suspended: the operator writes a small status of its own and creates nothing.
    e2e.create(ddpjob_manifest(name, e2e.image, command=python_command("pass"), suspend=True))
    e2e.wait_for_phase(name, "Suspended", 60)
    written = worst_valid().to_dict()
    size = len(json.dumps({"status": written}).encode())
    assert 300 * 1024 < size < STATUS_BUDGET, size  # the worst case, not a small one
    stored = e2e.custom.patch_namespaced_custom_object_status(
        names.API_GROUP, names.API_VERSION, e2e.namespace, names.PLURAL, name, {"status": written},
        _content_type="application/merge-patch+json")
    status = stored["status"]
    assert status["observedRanks"] == written["observedRanks"] and len(status["nodes"]) == 64
    assert status["failedNode"]["message"] == written["failedNode"]["message"]
    e2e.delete_job(name)
