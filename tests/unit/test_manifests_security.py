"""The security parts of manifests/ agree with each other (docs/security.md). What they do on
a real API server is tests/cluster/test_admission_policy.py; this catches drift in seconds."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
POLICY_API = "admissionregistration.k8s.io/v1"


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def by_kind(name: str, kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in documents(name) if d["kind"] == kind}


POLICY_FILES = ("admission-policy.yaml", "ownership-policy.yaml", "queue-label-policy.yaml")


def all_of(kind: str) -> dict[str, dict]:
    return {name: d for file in POLICY_FILES for name, d in by_kind(file, kind).items()}


def operator_user() -> str:
    account = next(d for d in documents("rbac.yaml") if d["kind"] == "ServiceAccount")
    return f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"


def test_kubectl_apply_k_installs_the_policies_and_the_roles():
    resources = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    assert set(POLICY_FILES) <= set(resources) and "user-roles.yaml" in resources


def test_every_policy_is_bound_to_deny_and_fails_closed():
    policies = all_of("ValidatingAdmissionPolicy")
    bindings = all_of("ValidatingAdmissionPolicyBinding")
    assert set(policies) == {"ddpjob-creator-rights", "ddpjob-operator-owned-children",
                             "ddpjob-ownership", "ddpjob-queue-label"}
    assert {b["spec"]["policyName"] for b in bindings.values()} == set(policies)
    for document in (*policies.values(), *bindings.values()):
        assert document["apiVersion"] == POLICY_API
    for binding in bindings.values():
        assert binding["spec"]["validationActions"] == ["Deny"]
    for policy in policies.values():
        assert policy["spec"]["failurePolicy"] == "Fail"
        for validation in policy["spec"]["validations"]:
            assert validation["reason"] == "Forbidden" and validation["messageExpression"]


def test_creator_policy_checks_pods_services_and_the_service_account():
    policy = by_kind("admission-policy.yaml", "ValidatingAdmissionPolicy")["ddpjob-creator-rights"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": ["ddpjob.dev"], "apiVersions": ["*"],
                      "operations": ["CREATE", "UPDATE"], "resources": ["ddpjobs"]}]
    checks = " ".join(v["expression"] for v in policy["spec"]["validations"])
    for needle in ("resource('pods')", "resource('services')", "check('create')",
                   "resource('serviceaccounts')", "check('impersonate')"):
        assert needle in checks, needle


def test_operator_guard_names_the_operators_service_account():
    """If the ServiceAccount of rbac.yaml were renamed, the guard would silently stop matching."""
    user = operator_user()
    guard = by_kind("admission-policy.yaml",
                    "ValidatingAdmissionPolicy")["ddpjob-operator-owned-children"]
    [condition] = guard["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{user}'"
    operator_role = by_kind("rbac.yaml", "ClusterRole")["ddpjob-operator"]
    created = {r for rule in operator_role["rules"] for r in rule["resources"]
               if {"create", "delete"} & set(rule["verbs"]) and rule["apiGroups"] == [""]}
    guarded = set(guard["spec"]["matchConstraints"]["resourceRules"][0]["resources"])
    assert created - {"events"} <= guarded


def test_roles_for_people_aggregate_like_kubernetes_workloads():
    roles = by_kind("user-roles.yaml", "ClusterRole")
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert roles["ddpjob-view"]["metadata"]["labels"][aggregate + "view"] == "true"
    assert roles["ddpjob-edit"]["metadata"]["labels"][aggregate + "edit"] == "true"
    assert roles["ddpjob-edit"]["metadata"]["labels"][aggregate + "admin"] == "true"
    for rule in roles["ddpjob-view"]["rules"]:
        assert set(rule["verbs"]) == {"get", "list", "watch"}
    for role in roles.values():
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            if "ddpjobs/status" in rule["resources"]:  # only the operator writes the status
                assert set(rule["verbs"]) <= {"get", "list", "watch"}


def test_operator_rbac_is_least_privilege():
    """Exactly the verbs docs/operator.md's "Permissions" table explains: no reads by name, no
    edits of other objects, no Secrets, no wildcards."""
    granted = {}
    for role in by_kind("rbac.yaml", "ClusterRole").values():
        for rule in role["rules"]:
            for resource in rule["resources"]:
                granted.setdefault(resource, set()).update(rule["verbs"])
    assert granted == {
        "customresourcedefinitions": {"list", "watch"},
        "namespaces": {"list", "watch"},
        "ddpjobs": {"list", "watch", "delete"},
        "ddpjobs/status": {"patch"},
        # OwnerReferencesPermissionEnforcement: the children's blockOwnerDeletion
        "ddpjobs/finalizers": {"update"},
        "pods": {"list", "watch", "create", "delete", "patch"},  # patch: relabel (in-place restart)
        "services": {"list", "watch", "create", "get"},  # get: whose one in the way is
        "events": {"create"},
        # Kueue (docs/kueue.md): the Workload of a queued job, its Finished/requeue status, and
        # the reads: the value of the WorkloadPriorityClass a job names, the admitted flavors.
        "workloads": {"list", "watch", "create", "delete"},
        "workloads/status": {"patch"},
        "workloadpriorityclasses": {"get"},
        "resourceflavors": {"get"},
    }


def test_the_operator_reads_no_secret_but_its_restart_key_in_its_own_namespace():
    """The namespaced Roles: the leader Lease, and the restart key (issue 35: a pod's restart
    token is made from its nonce with this key, never written into the pod)."""
    from ddpjob.controller import restart_key

    roles = by_kind("rbac.yaml", "Role")
    assert set(roles) == {"ddpjob-operator-leader-election", "ddpjob-operator-restart-key"}
    key_role = roles["ddpjob-operator-restart-key"]
    assert key_role["metadata"]["namespace"] == "ddpjob-system"
    assert sorted((tuple(r["resources"]), tuple(r["verbs"]), tuple(r.get("resourceNames", ())))
                  for r in key_role["rules"]) == [(("secrets",), ("create",), ()),
                                                   (("secrets",), ("get",), (restart_key.SECRET_NAME,))]
    bindings = by_kind("rbac.yaml", "RoleBinding")
    assert bindings["ddpjob-operator-restart-key"]["roleRef"]["name"] == "ddpjob-operator-restart-key"
    assert bindings["ddpjob-operator-restart-key"]["metadata"]["namespace"] == "ddpjob-system"


def test_ownership_policy_exempts_only_the_operator_and_the_garbage_collector():
    """Renaming the operator's ServiceAccount would make the policy refuse the operator's own
    pods; nobody else may be exempt."""
    policy = by_kind("ownership-policy.yaml", "ValidatingAdmissionPolicy")["ddpjob-ownership"]
    exempt = policy["spec"]["matchConditions"][0]["expression"]
    named = set(re.findall(r"'([^']+)'", exempt))
    assert named == {operator_user(), "system:serviceaccount:kube-system:generic-garbage-collector",
                     "system:kube-controller-manager"}
    assert exempt.startswith("!(request.userInfo.username in [")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    guarded = {r for rule in rules for r in rule["resources"]}
    assert {"pods", "services", "workloads"} <= guarded
    assert all(set(rule["operations"]) == {"CREATE", "UPDATE"} for rule in rules)


def test_queue_label_policy_guards_the_label_the_operator_reads():
    from ddpjob.controller import kueue

    policy = by_kind("queue-label-policy.yaml", "ValidatingAdmissionPolicy")["ddpjob-queue-label"]
    text = yaml.safe_dump(policy)
    assert f"'{kueue.QUEUE_LABEL}'" in text
    assert "object.spec.suspend" in policy["spec"]["validations"][0]["expression"]
