"""The DDPJob CustomResourceDefinition, built from the API model (never edited by hand).

``make generate`` (``python -m ddpjob.api.generate``) writes manifests/crd.yaml and docs/api.md;
a unit test fails when either differs from what the model generates. The ``spec`` schema comes
from ``ddpjob.api.spec`` and the ``status`` schema from ``ddpjob.api.status``, both through
``ddpjob.api.openapi``.
"""
from __future__ import annotations

from ddpjob.api import names
from ddpjob.api import openapi
from ddpjob.api import spec
from ddpjob.api.openapi import to_yaml


def printer_columns() -> list[dict]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "ready nodes / nodes"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts",
         "description": "gang restarts after failures of the job's own (failurePolicy.maxRestarts)"},
        # Beside Restarts: whose fault the restarts were (failurePolicy.maxDisruptions).
        {"name": "Disruptions", "type": "integer", "jsonPath": ".status.disruptions",
         "description": "gang restarts after preemption, eviction, a lost node, an unhealthy device"},
        {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary",
         "description": "step/total steps (percent), as the ranks report it"},
        {"name": "ETA", "type": "string", "jsonPath": ".status.progress.eta",
         "description": "time left at the current pace, while Running"},
        {"name": "Epoch", "type": "integer", "jsonPath": ".status.progress.epoch", "priority": 1},
        {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss", "priority": 1},
        {"name": "Throughput", "type": "number", "jsonPath": ".status.progress.throughput",
         "description": "samples per second", "priority": 1},
        {"name": "Goodput", "type": "string", "jsonPath": ".status.goodput.percent", "priority": 1,
         "description": "share of the wall time spent training (status.goodput)"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
        # How the last restart was done and what it cost (issue 22): an in-place restart shows as
        # InPlace and seconds, a recreated gang as Recreate and (usually) more of them.
        {"name": "Last-Restart", "type": "string", "jsonPath": ".status.failureHistory[0].restartMode",
         "priority": 1, "description": "how the last gang restart was done: InPlace or Recreate"},
        {"name": "Restart-Time", "type": "number", "jsonPath": ".status.goodput.lastRestartSeconds",
         "priority": 1, "description": "seconds from the last failure to the next attempt's first progress report"},
        # The Kueue LocalQueue a job is queued through (docs/kueue.md): in the plain view, so that
        # a Queued job says where it waits; empty for a job without one.
        {"name": "Queue", "type": "string", "jsonPath": ".metadata.labels.kueue\\.x-k8s\\.io/queue-name",
         "description": "the Kueue LocalQueue (label kueue.x-k8s.io/queue-name)"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def object_schema() -> dict:
    """The openAPIV3Schema of a DDPJob: spec, status, and the object-level CEL rules."""
    return {
        "description": "DDPJob runs a PyTorch DistributedDataParallel job on nnodes pods.",
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Declared so that the object rules' fieldPath (.metadata.name) names a known field;
            # only name/generateName may be declared here.
            "metadata": {"type": "object", "properties": {"name": {"type": "string"},
                                                         "generateName": {"type": "string"}}},
            "spec": openapi.spec_schema(),
            "status": openapi.status_schema(),
        },
        "x-kubernetes-validations": [openapi.rule_schema(r) for r in spec.OBJECT_RULES],
    }


def build_crd() -> dict:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of DDPJob."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": names.CRD_NAME},
        "spec": {
            "group": names.API_GROUP,
            "names": {"kind": names.KIND, "listKind": f"{names.KIND}List",
                      "plural": names.PLURAL, "singular": names.SINGULAR,
                      "shortNames": list(names.SHORT_NAMES)},
            "scope": "Namespaced",
            "versions": [{
                "name": names.API_VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": printer_columns(),
                "schema": {"openAPIV3Schema": object_schema()},
            }],
        },
    }


HEADER = ("# Generated by `make generate` (python -m ddpjob.api.generate) from operator/ddpjob/api/.\n"
          "# Do not edit.\n")


def crd_yaml() -> str:
    """The text of manifests/crd.yaml."""
    return HEADER + to_yaml(build_crd())
