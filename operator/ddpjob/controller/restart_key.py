"""The operator's restart key (restart_orders.RestartKey): what turns a pod's public nonce into
its restart token, so that no token is ever written where the namespace's readers see it.

Kept in the Secret ``ddpjob-restart-key`` of the operator's namespace (the Role in
manifests/rbac.yaml lets the operator create a Secret there and read this one, nothing else):
every replica and every restart of the operator reads the same key, and pods made before a
restart can still be ordered. The first replica to start makes it; a replica that loses that
race reads the winner's. A key deleted or replaced makes the pods of before unreachable: their
orders are refused (401) and they are recreated, as any pod that takes no order is.
"""
from __future__ import annotations

import base64
import secrets
from typing import Any, Optional, Protocol

from ddpjob.api import names
from ddpjob.restart_orders import KEY_BYTES, RestartKey

SECRET_NAME = "ddpjob-restart-key"
DATA_KEY = "key"
TIMEOUT_SECONDS = 10.0

#: The key the passes use (reconcile's default). A random one until ``load`` replaces it: a
#: process that never loads one (the tests, ``ddpjob render``) still makes working pods, which
#: only it can order.
KEY = RestartKey(secrets.token_bytes(KEY_BYTES))


class SecretApi(Protocol):
    def get_secret(self, namespace: str, name: str, *, timeout: float) -> Optional[dict]: ...

    def create_secret(self, secret: dict, *, timeout: float) -> dict: ...


class RestartKeyError(RuntimeError):
    """The key's Secret is there but holds no usable key (someone edited it)."""


def load(api: SecretApi, namespace: str) -> RestartKey:
    """The key from the Secret, made first if there is none; sets ``KEY``."""
    global KEY
    secret = api.get_secret(namespace, SECRET_NAME, timeout=TIMEOUT_SECONDS)
    if secret is None:
        try:
            secret = api.create_secret(_new_secret(namespace), timeout=TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - another replica was first: read its key
            if getattr(exc, "already_exists", False) is not True:
                raise
            secret = api.get_secret(namespace, SECRET_NAME, timeout=TIMEOUT_SECONDS)
    KEY = RestartKey(_key_of(secret, namespace))
    return KEY


def _new_secret(namespace: str) -> dict[str, Any]:
    key = base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET_NAME, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "ddpjob-operator",
                                    "app.kubernetes.io/component": "restart-key"},
                         "annotations": {f"{names.API_GROUP}/what": "the key of in-place restart orders "
                                         "(docs/security.md, \"The restart token\")"}},
            "data": {DATA_KEY: key}}


def _key_of(secret: Optional[dict], namespace: str) -> bytes:
    where = f"Secret {namespace}/{SECRET_NAME}"
    data = (secret or {}).get("data") or {}
    try:
        key = base64.b64decode(str(data.get(DATA_KEY) or ""), validate=True)
    except ValueError:
        raise RestartKeyError(f"{where}: data.{DATA_KEY} is not base64; delete the Secret and restart the "
                        "operator to make a new key") from None
    if len(key) < KEY_BYTES:
        raise RestartKeyError(f"{where}: data.{DATA_KEY} holds {len(key)} bytes, at least {KEY_BYTES} are "
                        "needed; delete the Secret and restart the operator to make a new key")
    return key
