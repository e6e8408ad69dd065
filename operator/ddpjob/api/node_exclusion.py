"""Bad-node avoidance: which Kubernetes nodes the job's next pods stay off, and how (pure).

A node implicated in ``failurePolicy.excludeNodeAfterFailures`` (N, default 2) of the job's
recorded failures is listed in ``status.excludedNodes`` (``with_exclusions``, called by
``controller.decide`` when a failure is recorded), and every pod created afterwards carries a
required node affinity ``kubernetes.io/hostname NotIn [...]`` (``avoiding``, applied where the
pods are built), ANDed with the user's own affinity.

Which failures implicate a node. The evidence is ``status.failureHistory``: one entry per failure
that restarted the gang or ended the job, its culprit and the node it ran on (the last
FAILURE_HISTORY_LIMIT of them, so N is at most that). One failure says little about a node: a
bug in the code fails wherever the rank runs. The same node in N of them is the evidence; a
code bug then fails again elsewhere and spends maxRestarts as before, so excluding costs only
placement freedom, never correctness. Counted:

* an **application failure with an exit code of its own** on the node: any non-zero code but
  the consequences 143, 12 and 13 (``contract.CONSEQUENCE_EXIT_CODES``: SIGTERM from a peer's
  torchrun or a deletion, a peer that never joined, a peer lost). Those say another rank
  failed, not that this node did; the culprit is only one of them when nothing else failed.
* a **disruption of the node itself** (``NODE_DISRUPTIONS``): NotReady or unreachable (the
  taint manager), gone (the pod GC), the kubelet's pressure eviction or shutdown, NodeLost, an
  unhealthy device.

Not counted: preemption (the scheduler's or a critical pod's) and the Eviction API (a drain, an
administrator's choice: the node is cordoned anyway): someone else wanted the place, the node is
fine; a pod deleted without a disruption (a user's ``kubectl delete``); a stall (the suspect rank
is the one that fell behind, which a slow peer on another node can cause). A record without a
node name (the pod was never scheduled) implicates no node.

Excluded nodes stay excluded for the job's life; at most EXCLUDED_NODES_LIMIT are kept (the
newest: an old exclusion gives way to a fresh one). If the exclusion leaves the gang nowhere to
go, its pods stay Pending with the scheduler's reason, as without it, and the status message
says that the job avoids these nodes (``unschedulable_note``). Under Kueue the admitted flavor's
nodeSelector and the exclusion both apply (docs/kueue.md).
"""
from __future__ import annotations

import copy
import datetime as dt
from collections import Counter
from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence

from ddpjob import contract
from ddpjob.api import spec
from ddpjob.api.status import (
    APPLICATION, DISRUPTION, EXCLUDED_NODES_LIMIT, EXCLUSION_MESSAGE_LIMIT, REASON_LIMIT, ExcludedNode,
    FailureRecord, JobStatus, format_time, listed, shorten,
)

HOSTNAME_LABEL = "kubernetes.io/hostname"
#: Disruption reasons that say the node itself went bad (api/failure_policy.py names them all).
NODE_DISRUPTIONS = frozenset({
    "DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet", "Evicted", "NodeLost",
    "Shutdown", "NodeShutdown", "UnhealthyDevice"})
_LISTED_NODES = 3  # nodes a status message names before "and N more"


def implicates(record: FailureRecord) -> bool:
    """Whether a recorded failure counts against the node it ran on (the module's docstring)."""
    if not record.nodeName:
        return False
    if record.kind == DISRUPTION:
        return record.reason in NODE_DISRUPTIONS
    return (record.kind == APPLICATION and record.exitCode is not None and record.exitCode != 0
            and record.exitCode not in contract.CONSEQUENCE_EXIT_CODES)


def _words(record: FailureRecord) -> str:
    what = f"exit code {record.exitCode}" if record.exitCode is not None else record.reason
    return f"attempt {record.attempt}: {what}" + (f" ({record.reason})" if record.exitCode is not None and record.reason else "")


def with_exclusions(status: JobStatus, policy: spec.FailurePolicy, now: dt.datetime) -> JobStatus:
    """``status`` with every node implicated in ``policy.excludeNodeAfterFailures`` of its
    recorded failures in ``excludedNodes`` (a node listed before stays listed, its ``since``
    kept; the newest EXCLUDED_NODES_LIMIT kept)."""
    threshold = policy.excludeNodeAfterFailures
    if threshold <= 0:
        return status
    implicated = [r for r in status.failureHistory if implicates(r)]  # the newest first
    counts = Counter(r.nodeName for r in implicated)
    listed_before = {n.nodeName: n for n in status.excludedNodes}
    entries = list(status.excludedNodes)
    for node, count in counts.items():
        if count < threshold and node not in listed_before:
            continue
        mine = [r for r in implicated if r.nodeName == node]
        previous = listed_before.get(node)
        failures = max(count, previous.failures if previous else 0)
        message = f"{failures} failure(s) on {node}: " + "; ".join(_words(r) for r in reversed(mine))
        entry = ExcludedNode(nodeName=node, failures=failures, reason=shorten(mine[0].reason, REASON_LIMIT),
                             since=previous.since if previous else format_time(now),
                             message=shorten(message, EXCLUSION_MESSAGE_LIMIT))
        if previous is not None:
            entries[entries.index(previous)] = entry
        else:
            entries.append(entry)
    return replace(status, excludedNodes=tuple(entries[-EXCLUDED_NODES_LIMIT:]))


def newly_excluded(before: JobStatus, after: JobStatus) -> list[ExcludedNode]:
    """The nodes ``after`` excludes that ``before`` did not."""
    known = {n.nodeName for n in before.excludedNodes}
    return [n for n in after.excludedNodes if n.nodeName not in known]


def unschedulable_note(status: JobStatus) -> str:
    """What a message about pods the scheduler cannot place adds when the job avoids nodes."""
    if not status.excludedNodes:
        return ""
    names = listed([n.nodeName for n in status.excludedNodes], _LISTED_NODES)
    return (f" (the pods avoid {len(status.excludedNodes)} node(s) after failures there: {names}; "
            "status.excludedNodes, failurePolicy.excludeNodeAfterFailures: the scheduler's verdict "
            "below counts them out)")


def merge_affinity(affinity: Optional[Mapping[str, Any]], node_names: Sequence[str]) -> Optional[dict[str, Any]]:
    """The user's ``affinity`` with ``hostname NotIn node_names`` added to every required node
    selector term (terms are ORed, a term's expressions ANDed: adding it to each keeps the
    user's choice and excludes the nodes from all of it); one term of its own if there is none."""
    merged = copy.deepcopy(dict(affinity)) if affinity else {}
    if not node_names:
        return merged or None
    expression = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(set(node_names))}
    node_affinity = merged.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = [t for t in required.get("nodeSelectorTerms") or () if isinstance(t, Mapping)]
    if not terms:
        terms = [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchExpressions": list(term.get("matchExpressions") or ()) + [dict(expression)]}
        for term in terms]
    return merged


def avoiding(job: spec.DDPJob, excluded: Sequence[ExcludedNode]) -> spec.DDPJob:
    """The job as the pods of its next attempt are built: its template's affinity keeps every
    ``excluded`` node out (``merge_affinity``); the job itself when none is."""
    if not excluded:
        return job
    tmpl = job.spec.template.spec
    merged = replace(tmpl, affinity=merge_affinity(tmpl.affinity, [n.nodeName for n in excluded]))
    return replace(job, spec=replace(job.spec, template=replace(job.spec.template, spec=merged)))
