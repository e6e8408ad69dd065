"""The host's firewall, as far as the test bed's bridge is concerned.

A Docker engine on the same host (needed for the kind tier) sets the iptables FORWARD policy to
DROP, and with br_netfilter loaded every frame crossing a Linux bridge goes through that chain:
the bed's pods would still resolve names (DNS is host-to-pod traffic, not forwarded) but never
connect to each other. When iptables is installed, the bed accepts its own bridge's
bridge-internal traffic explicitly (a rule tagged with the bridge's name, removed at teardown),
and ``Bridge.check_pods_can_connect`` proves the result either way.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

BRIDGE_NF_CALL_IPTABLES = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


def _comment(bridge: str) -> str:
    return f"ddpjob-testbed:{bridge}"


def _rule(bridge: str) -> list[str]:
    return ["-i", bridge, "-o", bridge, "-m", "comment", "--comment", _comment(bridge), "-j", "ACCEPT"]


def _iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True)


def bridged_traffic_is_filtered() -> bool:
    """Whether frames crossing a bridge pass through iptables here (br_netfilter loaded, on)."""
    try:
        return BRIDGE_NF_CALL_IPTABLES.read_text().strip() == "1"
    except OSError:
        return False


def accept_bridged_traffic(bridge: str) -> bool:
    """Accept traffic between ports of ``bridge`` ahead of any DROP; True if a rule is in place."""
    if shutil.which("iptables") is None or not bridged_traffic_is_filtered():
        return False
    if _iptables("-C", "FORWARD", *_rule(bridge)).returncode == 0:
        return True
    return _iptables("-I", "FORWARD", "1", *_rule(bridge)).returncode == 0


def remove_rules(bridge: str) -> None:
    if shutil.which("iptables") is None:
        return
    while _iptables("-D", "FORWARD", *_rule(bridge)).returncode == 0:
        pass


def describe() -> str:
    """One line on what filters bridged traffic here, for an error message."""
    if not bridged_traffic_is_filtered():
        return "bridge-nf-call-iptables is off, so something else drops the traffic"
    if shutil.which("iptables") is None:
        return ("br_netfilter passes bridged frames through iptables, and iptables is not "
                "installed to inspect or change the FORWARD chain")
    policy = _iptables("-S", "FORWARD").stdout.splitlines()[:1]
    return f"br_netfilter passes bridged frames through iptables, FORWARD chain {policy}"
