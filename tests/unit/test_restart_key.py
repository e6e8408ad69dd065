"""The operator's restart key (controller/restart_key.py): made once, in a Secret of its own
namespace, read by every replica and after every restart; an edited Secret is said plainly."""
from __future__ import annotations

import base64

import pytest

from ddpjob.controller import restart_key
from ddpjob.controller.kube import ApiError

pytestmark = pytest.mark.unit


class FakeSecrets:
    """One namespace's Secrets, with the race of two replicas (``first``: made by the other one
    between this one's GET and its POST)."""

    def __init__(self, first: dict | None = None):
        self.stored: dict[str, dict] = {}
        self.first = first
        self.log: list[str] = []

    def get_secret(self, namespace, name, *, timeout):
        self.log.append(f"get {namespace}/{name}")
        return self.stored.get(name)

    def create_secret(self, secret, *, timeout):
        self.log.append(f"create {secret['metadata']['namespace']}/{secret['metadata']['name']}")
        if self.first is not None:
            self.stored[secret["metadata"]["name"]] = self.first
            raise ApiError(409, "AlreadyExists", "secrets \"ddpjob-restart-key\" already exists", "create Secret")
        self.stored[secret["metadata"]["name"]] = secret
        return secret


def test_the_first_replica_makes_the_key_and_the_next_reads_the_same():
    api = FakeSecrets()
    first = restart_key.load(api, "ddpjob-system")
    assert api.log == ["get ddpjob-system/ddpjob-restart-key", "create ddpjob-system/ddpjob-restart-key"]
    secret = api.stored["ddpjob-restart-key"]
    assert secret["type"] == "Opaque" and len(base64.b64decode(secret["data"]["key"])) == 32
    again = restart_key.load(api, "ddpjob-system")  # a restart, or the other replica
    assert again.token("ns", "p", "n") == first.token("ns", "p", "n") and restart_key.KEY is again


def test_a_replica_that_loses_the_race_reads_the_winners_key():
    winner = {"data": {"key": base64.b64encode(b"w" * 32).decode()}}
    api = FakeSecrets(first=winner)
    key = restart_key.load(api, "ddpjob-system")
    assert api.log[-1] == "get ddpjob-system/ddpjob-restart-key"
    from ddpjob.restart_orders import RestartKey
    assert key.token("ns", "p", "n") == RestartKey(b"w" * 32).token("ns", "p", "n")


@pytest.mark.parametrize("data, said", [({"key": "not base64!"}, "not base64"),
                                        ({"key": base64.b64encode(b"x" * 8).decode()}, "holds 8 bytes"),
                                        ({}, "holds 0 bytes")])
def test_an_edited_secret_is_said_with_the_way_out(data, said):
    api = FakeSecrets()
    api.stored["ddpjob-restart-key"] = {"data": data}
    with pytest.raises(restart_key.RestartKeyError) as error:
        restart_key.load(api, "ddpjob-system")
    assert said in str(error.value) and "delete the Secret" in str(error.value)


def test_another_error_is_raised_for_the_caller_to_say():
    class Refused(FakeSecrets):
        def create_secret(self, secret, *, timeout):
            raise ApiError(403, "Forbidden", "secrets is forbidden", "create Secret")

    with pytest.raises(ApiError):
        restart_key.load(Refused(), "ddpjob-system")


@pytest.fixture(autouse=True)
def _keep_the_process_key():
    saved = restart_key.KEY
    yield
    restart_key.KEY = saved
