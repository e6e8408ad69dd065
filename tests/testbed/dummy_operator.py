"""A stand-in kopf operator for the test bed's own tests: proves that `start_operator` runs
kopf as a ServiceAccount whose RBAC is enforced, before the real operator exists.

It logs every pod labelled ``testbed.ddpjob.dev/dummy=watch`` it sees, and on startup tries
to list Secrets (its test grants no such verb) and logs the HTTP status it got.
"""
import kopf
import kubernetes


@kopf.on.startup()
def probe_forbidden_verb(logger, **_):
    kubernetes.config.load_kube_config()  # the KUBECONFIG the fixture wrote: the SA token
    try:
        kubernetes.client.CoreV1Api().list_secret_for_all_namespaces(limit=1)
        logger.info("RBAC-PROBE list secrets: allowed")
    except kubernetes.client.ApiException as error:
        logger.info(f"RBAC-PROBE list secrets: {error.status}")


@kopf.on.event("v1", "pods", labels={"testbed.ddpjob.dev/dummy": "watch"})
def log_pod(type, namespace, name, logger, **_):  # noqa: A002 - kopf's argument name
    logger.info(f"DUMMY-SAW {type} {namespace}/{name}")
