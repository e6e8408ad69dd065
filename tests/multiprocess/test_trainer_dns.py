"""torch's TCPStore retries a master name that does not resolve yet (pytorch/pytorch#73682, fixed
by #74641), until init_process_group's timeout.

Why it matters: in a cluster node 0's DNS record can appear after the pods start. ddptrain-pod
waits for the master before starting torchrun (rendezvous_wait: the name *and* the port, on
nodes other than 0); the init guard used to wait for the name a second time before each
guarded init_process_group. This test is the proof that the second wait is torch's job: two
real gloo ranks whose MASTER_ADDR resolves only seconds after both are inside
init_process_group form their group.

How a name "appears": the ranks run in a private mount namespace (``unshare --mount``) whose
/etc/hosts is a copy bind-mounted over the real one; the test adds the name to the copy. The
machine's /etc/hosts is never touched.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

LATE_NAME = "late-master.ddpjob.test"
SECONDS_UNRESOLVABLE = 4.0

# One rank: note when it enters init_process_group, then how long the call took.
RANK = textwrap.dedent('''
    import datetime, os, sys, time
    import torch.distributed as dist
    out = sys.argv[1]
    open(os.path.join(out, "in-init-" + os.environ["RANK"]), "w").close()
    started = time.monotonic()
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    took = time.monotonic() - started
    dist.barrier()
    open(os.path.join(out, "took-" + os.environ["RANK"]), "w").write(str(took))
    dist.destroy_process_group()
''')

# Inside the private mount namespace: hide the name, start both ranks, let the name appear once
# both are inside init_process_group, and report.
DRIVER = textwrap.dedent('''
    import os, shutil, socket, subprocess, sys, time
    out, port, name, hidden_for = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    hosts = os.path.join(out, "hosts")
    shutil.copyfile("/etc/hosts", hosts)
    subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)
    try:
        socket.getaddrinfo(name, None)
        sys.exit("setup: " + name + " resolves before the test made it resolvable")
    except OSError:
        pass
    env = dict(os.environ, MASTER_ADDR=name, MASTER_PORT=port, WORLD_SIZE="2")
    ranks = [subprocess.Popen([sys.executable, os.path.join(out, "rank.py"), out],
                              env=dict(env, RANK=str(r))) for r in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(os.path.exists(os.path.join(out, f"in-init-{r}")) for r in (0, 1)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in ranks):
            sys.exit("setup: the ranks did not reach init_process_group")
        time.sleep(0.1)
    time.sleep(hidden_for)
    gave_up = [r for r, p in enumerate(ranks) if p.poll() is not None]
    if gave_up:
        sys.exit(f"torch gave up on the unresolvable name: rank(s) {gave_up} exited "
                 f"{[ranks[r].returncode for r in gave_up]} within {hidden_for}s")
    with open(hosts, "a") as f:  # the bind mount shows the same file: the name now resolves
        f.write("127.0.0.1 " + name + "\\n")
    codes = [p.wait(timeout=90) for p in ranks]
    print("exit codes", codes, flush=True)
    sys.exit(0 if codes == [0, 0] else 1)
''')


def _namespace_prefix() -> list[str]:
    """How to run a command in a private mount namespace here (root, or a user namespace)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) (util-linux) for a private /etc/hosts")
    for prefix in ([unshare, "--mount", "--propagation", "private"],
                   [unshare, "--map-root-user", "--mount", "--propagation", "private"]):
        probe = subprocess.run([*prefix, "mount", "--bind", "/etc/hosts", "/etc/hosts"],
                               capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    pytest.skip("cannot bind-mount over /etc/hosts in a private mount namespace here: "
                + probe.stderr.decode(errors="replace").strip())


@pytest.mark.timeout(240)
def test_tcpstore_waits_for_a_master_name_that_resolves_late(mp, tmp_path, trainer_env):
    prefix = _namespace_prefix()
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "driver.py").write_text(DRIVER)
    proc = subprocess.run(
        [*prefix, sys.executable, str(tmp_path / "driver.py"), str(tmp_path),
         str(mp.free_port()), LATE_NAME, str(SECONDS_UNRESOLVABLE)],
        env=trainer_env, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    took = [float((tmp_path / f"took-{r}").read_text()) for r in (0, 1)]
    # Both ranks really waited for the name (rank 0 too: its own client resolves the master).
    assert min(took) >= SECONDS_UNRESOLVABLE, took
    assert not Path("/etc/hosts").read_text().count(LATE_NAME)  # the machine's file untouched
