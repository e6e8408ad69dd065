"""The test bed on a host whose firewall drops forwarded traffic, as a Docker engine leaves it.

Run inside a network namespace of its own, so that its FORWARD DROP never touches the real
host (nor a test bed running beside it): the bridge and the probe pods live in that namespace,
where iptables and the bridge-netfilter switch are separate from the host's.
"""
from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.testbed.target import local_testbed_only

pytestmark = [pytest.mark.cluster, local_testbed_only]
REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import subprocess, sys
    from tests.testbed import host_firewall
    from tests.testbed.pod_network import Bridge

    subprocess.run(["iptables", "-P", "FORWARD", "DROP"], check=True)       # what dockerd does
    open(host_firewall.BRIDGE_NF_CALL_IPTABLES, "w").write("1")             # br_netfilter on
    bridge = Bridge(sys.argv[1], "10.254.7.0/24")
    try:
        bridge.setup()  # adds the ACCEPT rule, then proves two pods connect
        print("setup ok")
        host_firewall.remove_rules(bridge.name)
        try:
            bridge.check_pods_can_connect(timeout=2)
        except RuntimeError as error:
            print("without the rule:", error)
    finally:
        bridge.teardown()
""")


@pytest.mark.skipif(shutil.which("iptables") is None,
                    reason="iptables is not installed (scripts/install-test-deps.sh installs it)")
def test_pods_connect_when_the_forward_policy_is_drop_and_the_bed_says_why_otherwise():
    host = f"fwtest-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", host], check=True)
    try:
        subprocess.run(["ip", "-n", host, "link", "set", "lo", "up"], check=True)
        done = subprocess.run(["ip", "netns", "exec", host, sys.executable, "-c", SCRIPT, "fwbr0"],
                              capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    finally:
        subprocess.run(["ip", "netns", "del", host], capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "setup ok" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "without the rule: pods on bridge fwbr0 cannot connect to each other" in done.stdout
    assert "FORWARD" in done.stdout and "iptables -I FORWARD -i fwbr0 -o fwbr0 -j ACCEPT" in done.stdout
