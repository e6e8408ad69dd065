"""The test node's stand-in for the image's files (tests/testbed/pod_image.py): which host
folders under /tmp the node agent binds back into each pod's private /tmp, read-only (issue 34:
a checkout under /tmp, its path with a space). That the binds work is the cluster tier's
(test_testbed.py, test_pods_import_the_checkout_under_test)."""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.testbed import pod_image
from tests.testbed.pod_image import host_image_paths, image_paths_under_tmp

pytestmark = pytest.mark.unit


@pytest.fixture
def checkout_under_tmp():
    """A checkout's source folders at a path under /tmp with a space (whatever $TMPDIR says)."""
    root = Path(tempfile.mkdtemp(prefix="ddpjob checkout ", dir="/tmp"))
    for folder in ("operator", "trainer"):
        (root / folder).mkdir()
    yield root
    shutil.rmtree(root)


def test_only_paths_strictly_under_tmp_parents_first():
    paths = image_paths_under_tmp([
        "/tmp/x y/trainer", "/tmp/x y/", "/tmp/x y/operator/../trainer", "/tmp", "/tmp/",
        "/usr/lib/python3.11", "relative/tmp/x", "", "/tmpfoo/x", "//tmp/z",
    ])
    assert paths == ["/tmp/x y", "/tmp/z", "/tmp/x y/trainer"]


def test_tmp_itself_is_never_bound_back():
    """Binding the host's /tmp into the pod would undo its private /tmp."""
    assert image_paths_under_tmp(["/tmp", "/tmp/.", "/tmp/x/..", "/"]) == []


def test_the_pods_pythonpath_under_tmp_with_a_space(checkout_under_tmp):
    pythonpath = ":".join([str(checkout_under_tmp / folder)
                           for folder in ("operator", "trainer", "gone")] + ["/usr/lib"])
    paths = host_image_paths(pythonpath)
    assert str(checkout_under_tmp / "operator") in paths
    assert str(checkout_under_tmp / "trainer") in paths
    assert str(checkout_under_tmp / "gone") not in paths  # only existing folders
    assert all(p.startswith("/tmp/") for p in paths)


def test_a_symlink_into_tmp_counts_by_its_real_folder_too(checkout_under_tmp):
    link = checkout_under_tmp / "link"
    link.symlink_to(checkout_under_tmp / "trainer")
    paths = host_image_paths(str(link))
    assert str(link) in paths and str(checkout_under_tmp / "trainer") in paths


def test_the_interpreter_under_tmp_is_bound(monkeypatch, checkout_under_tmp):
    """A virtual environment under /tmp: its prefix holds `python` and site-packages."""
    venv = checkout_under_tmp / ".venv"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python"))
    paths = host_image_paths(None)
    assert str(venv) in paths and str(venv / "bin") in paths


class FakeDistribution:
    def __init__(self, direct_url: str | None):
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return self.direct_url


def test_an_editable_install_under_tmp_is_found_by_its_project_folder(monkeypatch,
                                                                      checkout_under_tmp):
    """Its import hook maps packages into the folder, so no import path names it."""
    url = "file://" + str(checkout_under_tmp).replace(" ", "%20")
    monkeypatch.setattr(pod_image.importlib.metadata, "distributions", lambda: [
        FakeDistribution('{"dir_info": {"editable": true}, "url": "%s"}' % url),
        FakeDistribution('{"dir_info": {}, "url": "file:///tmp/a-wheel-built-here"}'),
        FakeDistribution('{"url": "https://example.com/x.whl", "archive_info": {}}'),
        FakeDistribution("not json"),
        FakeDistribution(None),
    ])
    assert str(checkout_under_tmp) in host_image_paths(None)
    assert "/tmp/a-wheel-built-here" not in pod_image._editable_project_dirs()
