"""Which cluster the end-to-end suite runs against: DDPJOB_E2E_TARGET=local (default: the
test bed started by the fixtures) or kind (the current kube context)."""
import os

import pytest

TARGET = os.environ.get("DDPJOB_E2E_TARGET", "local")

# For tests that check the local test bed itself rather than behaviour a cluster shares.
local_testbed_only = pytest.mark.skipif(
    TARGET != "local", reason="checks the local test bed itself (DDPJOB_E2E_TARGET=local)")


# For tests that need what only a real kubelet serves, such as a pod's log through the API
# server (pods/log): the local test bed's node agent runs the pods but serves no kubelet API.
# They carry the marker ``kubelet`` too, so the kind tier (which runs only those) runs them.
_skip_unless_kind = pytest.mark.skipif(
    TARGET != "kind", reason="needs a real kubelet: the local test bed's node agent serves no kubelet "
    "log endpoint, so pods/log cannot work there (DDPJOB_E2E_TARGET=kind)")


def kind_only(test):
    return pytest.mark.kubelet(_skip_unless_kind(test))
