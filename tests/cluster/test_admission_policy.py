"""Who may create a DDPJob, on the real API server (docs/security.md).

manifests/admission-policy.yaml refuses a DDPJob whose creator (or spec editor) could not
create its pods and Service directly, or may not impersonate the ServiceAccount it names;
manifests/user-roles.yaml aggregates DDPJob rights into the built-in view, edit and admin
roles. Users are impersonated (``kubectl --as``) by the test bed's admin, so every request
below is authorized as that user by the API server's RBAC and admission, nothing mocked.

No operator is needed: admission happens before it sees anything, and the admitted jobs
are suspended so that no pods start.
"""
from __future__ import annotations

import json
import secrets

import pytest

from tests.testbed.operator_runner import apply_manifests

from .e2e_support import GROUP, ddpjob_manifest

pytestmark = pytest.mark.cluster

POLICY = "ddpjob-creator-rights"
IMAGE = "localhost/ddpjob/trainer:0.1.0"


@pytest.fixture(scope="module")
def manifests_applied(kubectl) -> None:
    """manifests/ but the Deployment, as the operator fixture applies it (idempotent)."""
    apply_manifests(kubectl, include_workloads=False)


@pytest.fixture
def ns(namespace, manifests_applied) -> str:  # noqa: ARG001
    return namespace


def user_name(role: str) -> str:
    return f"{role}-{secrets.token_hex(3)}@example.com"


def as_user(kubectl, user: str, *args: str, input: str | None = None):
    return kubectl(f"--as={user}", *args, input=input, check=False)


def grant(kubectl, ns: str, user: str, name: str, rules: list[dict]) -> None:
    """A Role with these rules in ns, bound to user."""
    kubectl.apply_yaml([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": ns}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
    ])


def bind_cluster_role(kubectl, ns: str, user: str, cluster_role: str) -> None:
    kubectl("create", "rolebinding", f"{cluster_role}-{secrets.token_hex(3)}", "-n", ns,
            f"--clusterrole={cluster_role}", f"--user={user}")


DDPJOBS = {"apiGroups": [GROUP], "resources": ["ddpjobs"],
           "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}
PODS_AND_SERVICES = {"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["create"]}


def job(name: str, **spec) -> str:
    """A suspended DDPJob (admitted or not, it starts no pods) as JSON for kubectl."""
    return json.dumps(ddpjob_manifest(name, IMAGE, command=["true"], suspend=True, **spec))


def create_as(kubectl, ns: str, user: str, manifest: str):
    return as_user(kubectl, user, "create", "-n", ns, "-f", "-", input=manifest)


def refused_by_policy(result) -> bool:
    return result.returncode != 0 and f"ValidatingAdmissionPolicy '{POLICY}'" in result.stderr


def create_until_decided(cluster, ns: str, user: str, manifest: str, *, admitted: bool):
    """Create as user until the expected verdict (30 s at most). RBAC bindings reach the API
    server's authorizer cache a moment after they are written, so the first try may still be
    refused by RBAC itself; only the expected verdict ends the wait."""
    outcome = {}

    def decided() -> bool:
        result = create_as(cluster.kubectl, ns, user, manifest)
        outcome["last"] = result
        return (result.returncode == 0) if admitted else refused_by_policy(result)

    try:
        cluster.wait_for(decided, 30, f"{'admission' if admitted else 'refusal'} for {user}",
                         interval=0.5)
    except TimeoutError:
        last = outcome.get("last")
        pytest.fail(f"expected {'admitted' if admitted else 'refused by ' + POLICY}; last try "
                    f"exited {last.returncode}: {last.stdout}{last.stderr}")
    return outcome["last"]


def ddpjob_names(kubectl, ns: str) -> list[str]:
    items = json.loads(kubectl("get", "ddpjobs", "-n", ns, "-o", "json").stdout)["items"]
    return [item["metadata"]["name"] for item in items]


# -- the policy ------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", [POLICY, "ddpjob-operator-owned-children"])
def test_policies_and_bindings_are_installed_and_type_check(cluster, kubectl, manifests_applied,
                                                            policy):
    """kubectl apply -k manifests/ installs each policy and its binding, and the API server
    type-checks every CEL expression against the schemas it matches without a warning."""
    kubectl("get", "validatingadmissionpolicybinding", policy)

    def checked() -> dict | None:
        document = json.loads(kubectl("get", "validatingadmissionpolicy", policy, "-o",
                                      "json").stdout)
        status = document.get("status", {})
        if status.get("observedGeneration") != document["metadata"]["generation"]:
            return None
        return status

    status = cluster.wait_for(checked, 30, f"type checking of {policy}")
    assert not status.get("typeChecking", {}).get("expressionWarnings"), status


def test_creator_who_may_not_create_pods_is_refused(cluster, kubectl, ns):
    """The issue's user: DDPJobs yes, pods and Secrets no. Their job, which would mount a
    host path and print a Secret into its status, is refused, naming what is missing."""
    user = user_name("ddpjobs-only")
    grant(kubectl, ns, user, "ddpjobs-only", [DDPJOBS])
    leaky = job("leaky", env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "db", "key": "password"}}}],
        volumeMounts=[{"name": "host", "mountPath": "/host"}],
        template={"spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                           "securityContext": {"runAsUser": 0}}})
    result = create_until_decided(cluster, ns, user, leaky, admitted=False)
    assert f"user {user} may not create pods in namespace {ns}" in result.stderr
    assert "needs RBAC verb create on pods" in result.stderr
    assert "forbidden" in result.stderr.lower()
    assert ddpjob_names(kubectl, ns) == []


def test_creator_who_may_not_create_services_is_refused(cluster, kubectl, ns):
    user = user_name("no-services")
    grant(kubectl, ns, user, "no-services",
          [DDPJOBS, {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])
    result = create_until_decided(cluster, ns, user, job("no-svc"), admitted=False)
    assert f"user {user} may not create services in namespace {ns}" in result.stderr
    assert "may not create pods" not in result.stderr


def test_creator_who_may_create_the_children_is_admitted(cluster, kubectl, ns):
    user = user_name("pods-too")
    grant(kubectl, ns, user, "pods-too", [DDPJOBS, PODS_AND_SERVICES])
    create_until_decided(cluster, ns, user, job("fine"), admitted=True)
    # The namespace's default ServiceAccount, named or not, needs nothing more.
    create_until_decided(cluster, ns, user, job(
        "fine-default-sa", template={"spec": {"serviceAccountName": "default"}}), admitted=True)
    assert sorted(ddpjob_names(kubectl, ns)) == ["fine", "fine-default-sa"]


def test_named_service_account_needs_impersonate(cluster, kubectl, ns):
    """Pods may create pods as any ServiceAccount of the namespace; a DDPJob may name one
    only if its creator may impersonate it."""
    kubectl("create", "serviceaccount", "deployer", "-n", ns)
    user = user_name("sa-user")
    grant(kubectl, ns, user, "sa-user", [DDPJOBS, PODS_AND_SERVICES])
    wants_sa = job("as-deployer", template={"spec": {"serviceAccountName": "deployer"}})
    result = create_until_decided(cluster, ns, user, wants_sa, admitted=False)
    assert f"user {user} may not use ServiceAccount deployer" in result.stderr
    assert "spec.template.spec.serviceAccountName" in result.stderr
    assert "impersonate on serviceaccounts/deployer" in result.stderr
    assert "may not create pods" not in result.stderr

    # impersonate on that one account (and only it) is enough.
    grant(kubectl, ns, user, "sa-user-deployer", [{
        "apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"],
        "resourceNames": ["deployer"]}])
    create_until_decided(cluster, ns, user, wants_sa, admitted=True)
    other = job("as-other", template={"spec": {"serviceAccountName": "other"}})
    result = create_until_decided(cluster, ns, user, other, admitted=False)
    assert "may not use ServiceAccount other" in result.stderr


def test_spec_changes_are_checked_metadata_changes_are_not(cluster, kubectl, ns):
    """A spec edit makes the next attempt's pods, so the editor needs the same rights as a
    creator; labels and annotations (and the garbage collector's finalizer bookkeeping) do
    not create anything and are not checked."""
    kubectl("create", "-n", ns, "-f", "-", input=job("admins-job"))
    user = user_name("editor")
    grant(kubectl, ns, user, "editor", [DDPJOBS])

    def patch(body: dict):
        return as_user(kubectl, user, "patch", "ddpjob", "admins-job", "-n", ns,
                       "--type=merge", "-p", json.dumps(body))

    cluster.wait_for(lambda: refused_by_policy(patch({"spec": {"suspend": False}})), 30,
                     "the policy to refuse the spec change")
    result = patch({"spec": {"template": {"spec": {"serviceAccountName": "deployer"}}}})
    assert refused_by_policy(result), result.stderr
    spec = json.loads(kubectl("get", "ddpjob", "admins-job", "-n", ns, "-o", "json").stdout)["spec"]
    assert spec["suspend"] is True and "serviceAccountName" not in spec["template"]["spec"]

    result = patch({"metadata": {"labels": {"team": "vision"}}})
    assert result.returncode == 0, result.stderr
    # and the operator's status writes (the status subresource) are not matched at all
    result = kubectl("patch", "ddpjob", "admins-job", "-n", ns, "--subresource=status",
                     "--type=merge", "-p", json.dumps({"status": {"message": "x"}}),
                     check=False)
    assert result.returncode == 0, result.stderr


# -- the aggregated roles ------------------------------------------------------------------
def can_i(kubectl, user: str, verb: str, resource: str, ns: str) -> bool:
    """``kubectl auth can-i`` as user; ``pods/log`` means the subresource (kubectl alone would
    read it as the pod named log)."""
    resource, _, subresource = resource.partition("/")
    extra = [f"--subresource={subresource}"] if subresource else []
    result = as_user(kubectl, user, "auth", "can-i", verb, resource, *extra, "-n", ns)
    return result.stdout.strip() == "yes"


def test_builtin_edit_may_run_ddpjobs_and_view_may_only_read(cluster, kubectl, ns):
    editor, viewer, admin = user_name("edit"), user_name("view"), user_name("admin")
    bind_cluster_role(kubectl, ns, editor, "edit")
    bind_cluster_role(kubectl, ns, viewer, "view")
    bind_cluster_role(kubectl, ns, admin, "admin")
    # The controller-manager aggregates the roles a moment after they are applied.
    cluster.wait_for(lambda: can_i(kubectl, editor, "create", "ddpjobs", ns)
                     and can_i(kubectl, viewer, "get", "ddpjobs", ns)
                     and can_i(kubectl, admin, "create", "ddpjobs", ns), 60,
                     "ddpjob rights aggregated into edit, view and admin")

    kubectl("create", "serviceaccount", "runner", "-n", ns)
    create_until_decided(cluster, ns, editor, job(
        "by-editor", template={"spec": {"serviceAccountName": "runner"}}), admitted=True)
    create_until_decided(cluster, ns, admin, job("by-admin"), admitted=True)

    refused = create_as(kubectl, ns, viewer, job("by-viewer"))
    assert refused.returncode != 0
    assert "cannot create resource \"ddpjobs\"" in refused.stderr, refused.stderr
    listed = as_user(kubectl, viewer, "get", "ddpjobs", "-n", ns, "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.split()) == [f"ddpjob.{GROUP}/by-admin",
                                             f"ddpjob.{GROUP}/by-editor"]
    for verb in ("update", "patch", "delete"):
        assert not can_i(kubectl, viewer, verb, "ddpjobs", ns), verb
    # Nobody but the operator writes the status.
    for user in (editor, viewer, admin):
        assert not can_i(kubectl, user, "patch", "ddpjobs/status", ns), user
        assert can_i(kubectl, user, "get", "ddpjobs/status", ns), user
    # Whoever may read a DDPJob (and so its status) may read its pods as well.
    for user in (editor, viewer, admin):
        assert can_i(kubectl, user, "get", "pods", ns), user
        assert can_i(kubectl, user, "get", "pods/log", ns), user


# -- the operator's side: only what a DDPJob controls ---------------------------------------
OPERATOR_USER = "system:serviceaccount:ddpjob-system:ddpjob-operator"
GUARD = "ddpjob-operator-owned-children"


def pending_pod(name: str, owner: dict | None = None) -> str:
    """A pod no node can take (it stays Pending, nothing runs)."""
    meta: dict = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "nodeSelector": {"ddpjob.dev/test-no-such-node": "true"},
        "containers": [{"name": "c", "image": IMAGE, "command": ["true"]}]}})


def test_operator_may_create_and_delete_only_what_a_ddpjob_controls(cluster, kubectl, ns):
    """Its ClusterRole lets the operator create and delete any pod; the second policy lets
    it touch only pods and Services with a DDPJob as their controller."""
    kubectl("create", "-n", ns, "-f", "-", input=job("owner"))
    uid = kubectl("get", "ddpjob", "owner", "-n", ns, "-o", "jsonpath={.metadata.uid}").stdout
    owner = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "DDPJob", "name": "owner", "uid": uid,
             "controller": True, "blockOwnerDeletion": True}

    def refused_by_guard(result) -> bool:
        return result.returncode != 0 and f"ValidatingAdmissionPolicy '{GUARD}'" in result.stderr

    stray = lambda: as_user(kubectl, OPERATOR_USER, "create", "-n", ns, "-f", "-",  # noqa: E731
                            input=pending_pod("stray"))
    cluster.wait_for(lambda: refused_by_guard(stray()), 30, f"{GUARD} to refuse an unowned pod")
    result = stray()
    assert ("the DDPJob operator may create only pods that a DDPJob controls, and pods/stray "
            "has no controller ownerReference to a DDPJob") in result.stderr, result.stderr
    not_controller = {**owner, "controller": False}
    result = as_user(kubectl, OPERATOR_USER, "create", "-n", ns, "-f", "-",
                     input=pending_pod("not-controlled", not_controller))
    assert refused_by_guard(result), result.stderr
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "stray"},
               "spec": {"clusterIP": "None", "ports": [{"port": 29500}]}}
    result = as_user(kubectl, OPERATOR_USER, "create", "-n", ns, "-f", "-",
                     input=json.dumps(service))
    assert refused_by_guard(result), result.stderr

    result = as_user(kubectl, OPERATOR_USER, "create", "-n", ns, "-f", "-",
                     input=pending_pod("owned", owner))
    assert result.returncode == 0, result.stderr

    # Someone else's pod, even labelled as the job's, is not the operator's to delete.
    kubectl("create", "-n", ns, "-f", "-", input=pending_pod("users-pod"))
    kubectl("label", "pod", "users-pod", "-n", ns, "ddpjob.dev/job-name=owner")
    result = as_user(kubectl, OPERATOR_USER, "delete", "pod", "users-pod", "-n", ns,
                     "--wait=false")
    assert refused_by_guard(result), result.stderr
    assert "may delete only pods that a DDPJob controls" in result.stderr
    kubectl("get", "pod", "users-pod", "-n", ns)
    result = as_user(kubectl, OPERATOR_USER, "delete", "pod", "owned", "-n", ns,
                     "--grace-period=0", "--force", "--wait=false")
    assert result.returncode == 0, result.stderr
    # Anyone else is not matched: the admin deletes the user's pod as before.
    kubectl("delete", "pod", "users-pod", "-n", ns, "--wait=false")
