"""scripts/test.sh runs tier 1 in two lanes, each with its own test bed: lane 2 the cluster
files that scripts/tier1-lane2.txt lists, lane 1 everything else. A list that named a missing
file, a file twice, or a test outside tests/cluster would drop tests or run them twice."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def lane2() -> list[str]:
    lines = (ROOT / "scripts" / "tier1-lane2.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_lane_2_lists_existing_cluster_test_files_once():
    files = lane2()
    assert files and len(files) == len(set(files)), files
    for name in files:
        path = ROOT / name
        assert path.is_file() and path.parent == ROOT / "tests" / "cluster", name
        assert re.fullmatch(r"test_\w+\.py", path.name), name


def test_lane_2s_test_bed_shares_nothing_machine_wide_with_lane_1s_or_kinds():
    """Its own state folder, pod bridge and pod CIDR (the defaults are lane 1's: 10.244/16 and
    ddpjob0; kind's pods are on 10.245/16)."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "DDPJOB_TESTBED_DIR=/tmp/ddpjob-testbed-lane2" in script
    assert "DDPJOB_TESTBED_BRIDGE=ddpjob2" in script
    cidr = re.search(r"DDPJOB_TESTBED_POD_CIDR=(\S+)", script).group(1)
    assert cidr not in ("10.244.0.0/16", "10.245.0.0/16"), cidr
