"""Who may create a DDPJob, on the real API server (docs/security.md).

manifests/admission-policy.yaml refuses a DDPJob whose creator (or spec editor) could not
create its pods and Service directly, or may not impersonate the ServiceAccount it names;
manifests/user-roles.yaml aggregates DDPJob rights into the built-in view, edit and admin
roles; manifests/ownership-policy.yaml keeps anyone but the operator from making a pod a
job's; manifests/queue-label-policy.yaml keeps a job that may run in its Kueue queue. Users
are impersonated (``kubectl --as``) by the test bed's admin, so every request below is
authorized as that user by the API server's RBAC and admission, nothing mocked.

No operator is needed: admission happens before it sees anything, and the admitted jobs
are suspended so that no pods start.
"""
from __future__ import annotations

import json
import secrets

import pytest

from tests.testbed.operator_runner import apply_manifests
from tests.testbed.target import local_testbed_only

from .e2e_support import GROUP, as_user, ddpjob_manifest, grant, user_name, wait_until_allowed

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
@pytest.mark.parametrize("policy", [POLICY, "ddpjob-operator-owned-children", "ddpjob-ownership",
                                    "ddpjob-queue-label"])
@pytest.mark.kubelet
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


@pytest.mark.kubelet
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


# -- pod creator -> operator: only the operator makes a pod a job's -------------------------
OWNERSHIP = "ddpjob-ownership"
JOB_LABEL, RANK_LABEL, ATTEMPT_LABEL = (f"{GROUP}/job-name", f"{GROUP}/node-rank",
                                        f"{GROUP}/restart-attempt")


def refused_by(policy: str, result) -> bool:
    return result.returncode != 0 and f"ValidatingAdmissionPolicy '{policy}'" in result.stderr


def job_owner(kubectl, ns: str, name: str, **fields) -> dict:
    """A suspended DDPJob and a controller ownerReference to it, as the operator writes one."""
    kubectl("create", "-n", ns, "-f", "-", input=job(name))
    uid = kubectl("get", "ddpjob", name, "-n", ns, "-o", "jsonpath={.metadata.uid}").stdout
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "DDPJob", "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True, **fields}


def labelled_pod(name: str, job_name: str, *, attempt: int, owner: dict | None = None) -> dict:
    """A Pending pod (no node matches) with the labels of rank 0 of that job's attempt."""
    pod = json.loads(pending_pod(name, owner))
    pod["metadata"]["labels"] = {JOB_LABEL: job_name, RANK_LABEL: "0", ATTEMPT_LABEL: str(attempt)}
    return pod


def unwatched_owned_pod(name: str, owner: dict) -> dict:
    """A Pending pod the DDPJob controls but without the job-name label the operator's pod
    watch selects on: an operator serving the namespace (kind's, or one a test started in the
    same session) never sees it, so it is still there when the test edits it as a tenant. The
    policy judges a pod by its ownerReference and guards every ddpjob.dev/ label."""
    pod = json.loads(pending_pod(name, owner))
    pod["metadata"]["labels"] = {RANK_LABEL: "0", ATTEMPT_LABEL: "0"}
    return pod


def test_a_pod_creator_cannot_make_a_pod_of_someone_elses_job(cluster, kubectl, ns):
    """The issue's tenant: `create` on pods and services, nothing else. Every form of an
    ownerReference to a DDPJob is refused (a controller one, blockOwnerDeletion or not; one
    that is not the controller; kind DDPJob under another group, which the operator's code
    would have taken by its kind), on a pod and on a Service. The same pod without the
    reference, labels and all, is the tenant's own business and is admitted."""
    owner = job_owner(kubectl, ns, "victim", blockOwnerDeletion=False)
    tenant = user_name("pod-creator")
    grant(kubectl, ns, tenant, "pod-creator", [PODS_AND_SERVICES])
    wait_until_allowed(cluster, tenant, "create", "pods", ns)

    def create(document: dict):
        return as_user(kubectl, tenant, "create", "-n", ns, "-f", "-", input=json.dumps(document))

    forged = create(labelled_pod("forged", "victim", attempt=5, owner=owner))
    assert refused_by(OWNERSHIP, forged), forged.stdout + forged.stderr
    assert ("only the DDPJob operator creates pods with an ownerReference to a DDPJob, and "
            "pods/forged names DDPJob victim as its owner") in forged.stderr, forged.stderr
    for variant in ({"controller": False}, {"apiVersion": "evil.example/v1"},
                    {"kind": "Impostor"}):
        result = create(labelled_pod("forged", "victim", attempt=5, owner={**owner, **variant}))
        assert refused_by(OWNERSHIP, result), (variant, result.stdout + result.stderr)
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "victim", "ownerReferences": [owner]},
               "spec": {"clusterIP": "None", "ports": [{"port": 29500}]}}
    result = create(service)
    assert refused_by(OWNERSHIP, result), result.stdout + result.stderr
    assert "only the DDPJob operator creates services" in result.stderr
    assert kubectl("get", "pods,services", "-n", ns, "-o", "name").stdout.split() == []

    result = create(labelled_pod("look-alike", "victim", attempt=5))
    assert result.returncode == 0, result.stderr


def test_a_pod_editor_cannot_relabel_disown_or_adopt(cluster, kubectl, ns):
    """A tenant who may edit pods: relabelling one of the job's pods as a newer attempt (the
    operator would adopt it and delete the rest of the gang), taking away its reference to
    the job, or adding one to a pod of their own is refused; their other edits are not."""
    owner = job_owner(kubectl, ns, "victim")
    created = as_user(kubectl, OPERATOR_USER, "create", "-n", ns, "-f", "-",
                      input=json.dumps(unwatched_owned_pod("victim-node-0", owner)))
    assert created.returncode == 0, created.stderr
    tenant = user_name("pod-editor")
    # delete too, as `edit` has: OwnerReferencesPermissionEnforcement lets only those who may
    # delete a pod change its ownerReferences at all, and the policy is what is tested here.
    grant(kubectl, ns, tenant, "pod-editor", [{"apiGroups": [""], "resources": ["pods"], "verbs": [
        "get", "list", "create", "update", "patch", "delete"]}])
    wait_until_allowed(cluster, tenant, "patch", "pods", ns)

    def patch(pod: str, body, kind: str = "merge"):
        return as_user(kubectl, tenant, "patch", "pod", pod, "-n", ns, f"--type={kind}", "-p",
                       json.dumps(body))

    relabel = patch("victim-node-0", {"metadata": {"labels": {ATTEMPT_LABEL: "7"}}})
    assert refused_by(OWNERSHIP, relabel), relabel.stdout + relabel.stderr
    assert ("only the DDPJob operator changes the ddpjob.dev/ labels of pods/victim-node-0, "
            "which a DDPJob owns") in relabel.stderr, relabel.stderr
    unlabel = patch("victim-node-0", {"metadata": {"labels": {RANK_LABEL: None}}})
    assert refused_by(OWNERSHIP, unlabel), unlabel.stderr
    enlist = patch("victim-node-0", {"metadata": {"labels": {JOB_LABEL: "victim"}}})
    assert refused_by(OWNERSHIP, enlist), enlist.stderr
    disown = patch("victim-node-0", [{"op": "remove", "path": "/metadata/ownerReferences"}], "json")
    assert refused_by(OWNERSHIP, disown), disown.stderr
    assert "only the DDPJob operator adds, removes or changes an ownerReference" in disown.stderr
    unblock = patch("victim-node-0", [{"op": "replace", "path":
                                       "/metadata/ownerReferences/0/blockOwnerDeletion",
                                       "value": False}], "json")
    assert refused_by(OWNERSHIP, unblock), unblock.stderr
    # Labels of their own and the pod's other metadata stay the tenant's.
    assert patch("victim-node-0", {"metadata": {"labels": {"team": "vision"}}}).returncode == 0

    mine = as_user(kubectl, tenant, "create", "-n", ns, "-f", "-",
                   input=json.dumps(labelled_pod("mine", "victim", attempt=7)))
    assert mine.returncode == 0, mine.stderr
    adopt = patch("mine", {"metadata": {"ownerReferences": [{**owner, "blockOwnerDeletion": False}]}})
    assert refused_by(OWNERSHIP, adopt), adopt.stderr
    assert patch("mine", {"metadata": {"labels": {ATTEMPT_LABEL: "8"}}}).returncode == 0

    stored = json.loads(kubectl("get", "pod", "victim-node-0", "-n", ns, "-o", "json").stdout)
    assert stored["metadata"]["ownerReferences"] == [owner]
    assert stored["metadata"]["labels"] == {RANK_LABEL: "0", ATTEMPT_LABEL: "0", "team": "vision"}
    assert "ownerReferences" not in json.loads(
        kubectl("get", "pod", "mine", "-n", ns, "-o", "json").stdout)["metadata"]


def test_the_garbage_collector_still_orphans_the_jobs_pods(cluster, kubectl, ns):
    """`kubectl delete --cascade=orphan` makes the garbage collector take the reference off
    the job's pods: the policy lets it (it would otherwise hang the deletion)."""
    owner = job_owner(kubectl, ns, "orphaning")
    created = as_user(kubectl, OPERATOR_USER, "create", "-n", ns, "-f", "-",
                      input=json.dumps(unwatched_owned_pod("orphaning-node-0", owner)))
    assert created.returncode == 0, created.stderr
    kubectl("delete", "ddpjob", "orphaning", "-n", ns, "--cascade=orphan", "--wait=true",
            "--timeout=60s")

    def orphaned() -> bool:
        pod = json.loads(kubectl("get", "pod", "orphaning-node-0", "-n", ns, "-o", "json").stdout)
        return not pod["metadata"].get("ownerReferences")

    cluster.wait_for(orphaned, 30, "the garbage collector to orphan the pod")


# -- the operator's RBAC under OwnerReferencesPermissionEnforcement ---------------------------
@local_testbed_only
def test_the_test_bed_enforces_owner_reference_permissions(cluster, kubectl, ns):
    """The test bed's API server runs the OwnerReferencesPermissionEnforcement admission
    plugin (as OpenShift does): blockOwnerDeletion on a reference needs `update` on the
    owner's finalizers. So every test in which the operator creates a child proves the
    operator has it."""
    kubectl("create", "configmap", "owner", "-n", ns)
    uid = kubectl("get", "configmap", "owner", "-n", ns, "-o", "jsonpath={.metadata.uid}").stdout
    tenant = user_name("blocker")
    grant(kubectl, ns, tenant, "blocker", [PODS_AND_SERVICES])
    wait_until_allowed(cluster, tenant, "create", "pods", ns)
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
    blocking = as_user(kubectl, tenant, "create", "-n", ns, "-f", "-", input=pending_pod(
        "blocking", {**reference, "blockOwnerDeletion": True}))
    assert blocking.returncode != 0, blocking.stdout
    assert "cannot set blockOwnerDeletion" in blocking.stderr, blocking.stderr
    plain = as_user(kubectl, tenant, "create", "-n", ns, "-f", "-",
                    input=pending_pod("plain", reference))
    assert plain.returncode == 0, plain.stderr


def test_the_operator_may_block_its_jobs_deletion_on_its_children(cluster, kubectl, ns):
    """The operator's children carry blockOwnerDeletion (builders.owner_reference): under
    OwnerReferencesPermissionEnforcement that needs `update` on ddpjobs/finalizers, which
    manifests/rbac.yaml grants (without it every create is a 403)."""
    owner = job_owner(kubectl, ns, "blocked")
    pod = as_user(kubectl, OPERATOR_USER, "create", "-n", ns, "-f", "-",
                  input=pending_pod("blocked-node-0", owner))
    assert pod.returncode == 0, pod.stderr
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "blocked", "ownerReferences": [owner]},
               "spec": {"clusterIP": "None", "ports": [{"port": 29500}]}}
    created = as_user(kubectl, OPERATOR_USER, "create", "-n", ns, "-f", "-",
                      input=json.dumps(service))
    assert created.returncode == 0, created.stderr
    assert can_i(kubectl, OPERATOR_USER, "update", "ddpjobs/finalizers", ns)


# -- user -> Kueue: the queue label ----------------------------------------------------------
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
QUEUE_GUARD = "ddpjob-queue-label"


PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def test_the_priority_class_label_changes_only_while_suspended_and_is_never_removed(cluster, kubectl, ns):
    """Kueue's rule for its own job kinds: a gang admitted at one priority cannot claim
    another while it may run; a suspended one may change it (it queues again with it), but
    not drop it."""
    manifest = ddpjob_manifest("ranked", IMAGE, nnodes=1, command=["true"])
    manifest["metadata"]["labels"] = {QUEUE_LABEL: "team-a", PRIORITY_LABEL: "low"}
    kubectl("create", "-n", ns, "-f", "-", input=json.dumps(manifest))
    owner = user_name("ranker")
    grant(kubectl, ns, owner, "ranker", [DDPJOBS, PODS_AND_SERVICES])
    wait_until_allowed(cluster, owner, "patch", "ddpjobs", ns)

    def patch(body: dict):
        return as_user(kubectl, owner, "patch", "ddpjob", "ranked", "-n", ns, "--type=merge",
                       "-p", json.dumps(body))

    raised = patch({"metadata": {"labels": {PRIORITY_LABEL: "high"}}})
    assert refused_by(QUEUE_GUARD, raised), raised.stdout + raised.stderr
    assert ("the label kueue.x-k8s.io/priority-class of DDPJob ranked may change only while the "
            "job is suspended") in raised.stderr and "changes it from low to high" in raised.stderr
    dropped = patch({"metadata": {"labels": {PRIORITY_LABEL: None}}, "spec": {"suspend": True}})
    assert refused_by(QUEUE_GUARD, dropped), dropped.stderr
    assert "removes it (low)" in dropped.stderr
    moved = patch({"metadata": {"labels": {PRIORITY_LABEL: "high"}}, "spec": {"suspend": True}})
    assert moved.returncode == 0, moved.stderr
    stored = json.loads(kubectl("get", "ddpjob", "ranked", "-n", ns, "-o", "json").stdout)
    assert stored["metadata"]["labels"][PRIORITY_LABEL] == "high"


def test_the_queue_label_changes_only_while_the_job_is_suspended(cluster, kubectl, ns):
    """Kueue's rule for its own job kinds: a job that may run keeps its queue. Removing the
    label from a waiting job would start it ahead of the queue; removing or changing it on an
    admitted one would leave its quota behind; adding it to a running one would stop it."""
    def unsuspended(name: str, queue: str | None) -> str:
        manifest = ddpjob_manifest(name, IMAGE, nnodes=1, command=["true"])
        if queue:
            manifest["metadata"]["labels"] = {QUEUE_LABEL: queue}
        return json.dumps(manifest)

    kubectl("create", "-n", ns, "-f", "-", input=unsuspended("waiting", "team-a"))
    kubectl("create", "-n", ns, "-f", "-", input=unsuspended("unqueued", None))
    owner = user_name("job-owner")
    grant(kubectl, ns, owner, "job-owner", [DDPJOBS, PODS_AND_SERVICES])
    wait_until_allowed(cluster, owner, "patch", "ddpjobs", ns)

    def patch(name: str, body: dict):
        return as_user(kubectl, owner, "patch", "ddpjob", name, "-n", ns, "--type=merge",
                       "-p", json.dumps(body))

    def labels(name: str) -> dict:
        return json.loads(kubectl("get", "ddpjob", name, "-n", ns, "-o", "json").stdout)[
            "metadata"].get("labels", {})

    removed = patch("waiting", {"metadata": {"labels": {QUEUE_LABEL: None}}})
    assert refused_by(QUEUE_GUARD, removed), removed.stdout + removed.stderr
    assert ("the label kueue.x-k8s.io/queue-name of DDPJob waiting may change only while the job "
            "is suspended (spec.suspend: true, possibly in the same edit), as Kueue requires of "
            "its own job kinds; this edit removes it (team-a)") in removed.stderr, removed.stderr
    changed = patch("waiting", {"metadata": {"labels": {QUEUE_LABEL: "team-b"}}})
    assert refused_by(QUEUE_GUARD, changed), changed.stderr
    assert "changes it from team-a to team-b" in changed.stderr
    added = patch("unqueued", {"metadata": {"labels": {QUEUE_LABEL: "team-a"}}})
    assert refused_by(QUEUE_GUARD, added), added.stderr
    assert "adds it (team-a)" in added.stderr
    assert labels("waiting") == {QUEUE_LABEL: "team-a"} and labels("unqueued") == {}

    # Other labels are free; the queue moves with (or after) a suspension.
    assert patch("waiting", {"metadata": {"labels": {"team": "vision"}}}).returncode == 0
    moved = patch("waiting", {"metadata": {"labels": {QUEUE_LABEL: "team-b"}},
                              "spec": {"suspend": True}})
    assert moved.returncode == 0, moved.stderr
    left = patch("waiting", {"metadata": {"labels": {QUEUE_LABEL: None}}})
    assert left.returncode == 0, left.stderr
    assert labels("waiting") == {"team": "vision"}
    resumed = patch("waiting", {"spec": {"suspend": False}})
    assert resumed.returncode == 0, resumed.stderr
