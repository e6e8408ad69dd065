"""`ddpjob run`'s in-place restarts (ddpjob/local/in_place.py): the nodes' environment, the root
cause among their answers, the orders; real entry-point answers are the multiprocess tier's."""
from __future__ import annotations

import pytest

from ddpjob import contract
from ddpjob.api import spec
from ddpjob.contract import EntryState
from ddpjob.local import in_place
from ddpjob.local.in_place import InPlaceGang, root_cause
from ddpjob.local.plan import LocalSetup, NodeControl, job_environment
from tests.support import jobs

pytestmark = pytest.mark.unit


def make_job(**spec_fields):
    spec_fields.setdefault("image", "local")
    return jobs.make_job(2, name="demo", namespace="team-a", uid=None, **spec_fields)


def failed(attempt, code, since=1.0, message="m"):
    return EntryState(attempt=attempt, state=contract.ENTRY_FAILED, exit_code=code, message=message,
                      seconds_since_failure=since)


def running(attempt):
    return EntryState(attempt=attempt, state=contract.ENTRY_RUNNING)


def test_in_place_applies_to_the_entry_point_only_and_not_in_recreate_mode():
    assert in_place.applies(make_job().spec)
    assert not in_place.applies(make_job(failurePolicy=spec.FailurePolicy(restartMode="Recreate")).spec)
    assert not in_place.applies(make_job(command=["python", "train.py"]).spec)


def test_in_place_nodes_get_the_operators_variables_their_own_port_and_loopback():
    job = make_job(failurePolicy=spec.FailurePolicy(permanentExitCodes=(2, 7)))
    controls = [NodeControl(41000, "token-0"), NodeControl(41001, "token-1")]
    env = job_environment(job, node_rank=1, master_port=40000, restart_attempt=0,
                          setup=LocalSetup("/scratch"), environ={}, controls=controls)
    assert env[contract.DDPJOB_RESTART_MODE] == contract.RESTART_MODE_IN_PLACE
    assert env[contract.DDPJOB_RESTART_TOKEN] == "token-1"
    assert env[contract.DDPJOB_PROGRESS_PORT] == "41001"
    assert env[contract.DDPJOB_MASTER_PROGRESS_PORT] == "41000"  # node 0's, for the handshake
    assert env[contract.DDPJOB_PROGRESS_ADDRESS] == "127.0.0.1"  # nothing off this machine reaches it
    assert env[contract.DDPJOB_PERMANENT_EXIT_CODES] == "2,7"
    plain = job_environment(job, node_rank=1, master_port=40000, restart_attempt=0,
                            setup=LocalSetup("/scratch"), environ={})
    assert contract.DDPJOB_RESTART_TOKEN not in plain and plain[contract.DDPJOB_PROGRESS_PORT] == "0"


def test_a_spec_env_entry_cannot_move_the_restart_port_off_loopback():
    job = make_job(env=[{"name": "DDPJOB_PROGRESS_ADDRESS", "value": "0.0.0.0"}])
    controls = [NodeControl(41000, "a"), NodeControl(41001, "b")]
    env = job_environment(job, node_rank=0, master_port=40000, restart_attempt=0,
                          setup=LocalSetup("/scratch"), environ={}, controls=controls)
    assert env[contract.DDPJOB_PROGRESS_ADDRESS] == "127.0.0.1"


def test_new_controls_are_distinct_ports_and_tokens():
    controls = in_place.new_controls(4)
    assert len({c.port for c in controls}) == 4 and len({c.token for c in controls}) == 4
    assert all(c.port > 0 and len(c.token) >= 32 for c in controls)


def test_the_root_cause_is_the_nodes_own_failure_not_the_peer_that_lost_it():
    seen, wait = root_cause({0: failed(0, 13, since=2.0), 1: failed(0, 137, since=1.0)}, 0)
    assert (seen.node_rank, seen.exit_code, wait) == (1, 137, False)


def test_only_consequence_codes_told_just_now_wait_for_the_root_cause():
    seen, wait = root_cause({0: failed(0, 13, since=0.5), 1: running(0)}, 0)
    assert seen.exit_code == 13 and wait
    seen, wait = root_cause({0: failed(0, 13, since=in_place.CONSEQUENCE_GRACE_SECONDS + 1), 1: running(0)}, 0)
    assert seen.exit_code == 13 and not wait  # nobody else said anything: the peer loss decides


def test_a_permanent_code_decides_over_a_retryable_one():
    seen, _ = root_cause({0: failed(0, 1), 1: failed(0, 2)}, 0, permanent_codes=(2,))
    assert (seen.node_rank, seen.exit_code) == (1, 2)


def test_answers_about_another_attempt_or_from_nobody_are_no_failure():
    assert root_cause({0: failed(3, 137), 1: None}, 4) == (None, False)
    assert root_cause({0: running(4), 1: running(4)}, 4) == (None, False)


class Nodes:
    """Fake entry points: what each answers at /attempt and whether it takes orders."""

    def __init__(self, states, takes=(True, True)):
        self.states, self.takes, self.orders = dict(states), list(takes), []

    def fetch(self, ip, port, deadline):
        assert ip == "127.0.0.1" and deadline <= 1.0
        return self.states[port]

    def order(self, ip, port, token, attempt, deadline):
        self.orders.append((port, token, attempt))
        return self.takes[port - 41000]


def gang(nodes, clock=lambda: 0.0):
    controls = [NodeControl(41000, "t0"), NodeControl(41001, "t1")]
    return InPlaceGang(controls, contract.DEFAULT_PERMANENT_EXIT_CODES, fetch=nodes.fetch,
                       order=nodes.order, clock=clock)


def test_a_failure_is_found_then_every_node_is_ordered_with_its_own_token():
    nodes = Nodes({41000: running(0), 41001: failed(0, 137)})
    g = gang(nodes)
    seen = g.failure()
    assert (seen.node_rank, seen.exit_code) == (1, 137)
    assert g.order(1)
    assert nodes.orders == [(41000, "t0", 1), (41001, "t1", 1)]
    assert g.attempt == 1
    assert g.failure() is None  # attempt 0's failure is history now


def test_a_node_that_refuses_the_order_means_starting_anew():
    nodes = Nodes({41000: failed(0, 13), 41001: failed(0, 137)}, takes=(True, False))
    g = gang(nodes)
    assert not g.order(1)
    assert g.attempt == 0


def test_the_nodes_are_asked_at_most_once_per_poll_interval():
    now = [0.0]
    nodes = Nodes({41000: running(0), 41001: running(0)})
    calls = []
    original = nodes.fetch
    nodes.fetch = lambda *a: calls.append(a) or original(*a)
    g = gang(nodes, clock=lambda: now[0])
    g.failure(), g.failure()
    assert len(calls) == 2  # one round (two nodes)
    now[0] += in_place.POLL_SECONDS
    g.failure()
    assert len(calls) == 4
