"""`ddpjob submit DIR` reads a folder that may be hostile (a cloned repository): what leaves it,
what looks like a secret, what the ignore files say, and what a folder over 1 MiB is told
(ddpjob.client.code_package; issue 35, finding 1)."""
from __future__ import annotations

import io
import os

import pytest

from ddpjob.cli.main import build_parser
from ddpjob.cli.submit import run_submit
from ddpjob.client import code_package
from ddpjob.client.code_package import PackageError, read_package

pytestmark = pytest.mark.unit

SECRET = "ssh-secret-of-the-user"
PRIVATE_KEY = ("-----BEGIN " + "OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"  # split: no secret scanner alarm
               "-----END " + "OPENSSH PRIVATE KEY-----\n")


@pytest.fixture
def home(tmp_path):
    """A user's home: a secret outside the cloned repository, and the repository at clone/repo."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_rsa").write_text(SECRET + "\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "train.py").write_text(f"print('{SECRET}')\n")
    repo = tmp_path / "clone" / "repo"
    (repo / "lib").mkdir(parents=True)
    (repo / "train.py").write_text("from lib.util import f\nprint(f())\n")
    (repo / "lib" / "util.py").write_text("def f():\n    return 'ok'\n")
    return tmp_path


def dry_run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_submit(build_parser().parse_args(["submit", *argv, "--dry-run"]), out, err)
    return code, out.getvalue(), err.getvalue()


def refused(argv: list[str], *needles: str) -> str:
    """Exit 2, one line naming ``needles``, nothing printed, the secret nowhere."""
    code, out, err = dry_run(*argv)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert SECRET not in err and all(n in err for n in needles), err
    return err


# --- links that leave the folder ---------------------------------------------------------------

@pytest.mark.parametrize("target", ["../../.ssh/id_rsa", "ABSOLUTE", "/proc/self/environ", "/dev/zero"])
def test_a_link_to_a_file_outside_is_refused_naming_link_and_target(home, target):
    repo = home / "clone" / "repo"
    target = str(home / ".ssh" / "id_rsa") if target == "ABSOLUTE" else target
    os.symlink(target, repo / "notes.txt")
    refused([str(repo)], f"notes.txt -> {target}", "outside")


def test_a_link_chain_that_ends_outside_is_refused(home):
    repo = home / "clone" / "repo"
    os.symlink("../../../.ssh/id_rsa", repo / "lib" / "hop2")
    os.symlink("hop2", repo / "lib" / "hop1")
    os.symlink("lib/hop1", repo / "README.txt")
    refused([str(repo)], "README.txt -> lib/hop1", os.path.realpath(home / ".ssh" / "id_rsa"))


def test_a_link_to_a_folder_outside_is_refused(home):
    repo = home / "clone" / "repo"
    os.symlink(str(home / ".ssh"), repo / "keys")
    refused([str(repo)], "keys ->", "a link to the folder", "outside")


def test_the_entry_script_being_a_link_outside_is_refused(home):
    repo = home / "clone" / "repo"
    (repo / "train.py").unlink()
    os.symlink("../../elsewhere/train.py", repo / "train.py")
    refused([str(repo)], "train.py -> ../../elsewhere/train.py", "outside")
    refused([str(repo), "--entry", "train.py"], "train.py ->")
    # Named on its own, a script is read from the folder it is in, by the same rule.
    refused([str(repo / "train.py")], "train.py ->", "outside")
    # Naming the target itself is the user's own choice.
    assert read_package(str(home / "elsewhere" / "train.py")).files["train.py"] == f"print('{SECRET}')\n"


def test_a_link_to_a_file_left_out_is_refused(home):
    repo = home / "clone" / "repo"
    (repo / ".env").write_text(f"TOKEN={SECRET}\n")
    os.symlink(".env", repo / "env.txt")
    refused([str(repo)], "env.txt -> .env", "left out")


@pytest.mark.parametrize("make", ["fifo", "link-to-fifo"])
def test_a_fifo_is_refused_without_blocking(home, make):
    repo = home / "clone" / "repo"
    os.mkfifo(repo / "pipe")  # opening it for reading would block until a writer came
    if make == "link-to-fifo":
        os.rename(repo / "pipe", repo / "lib" / "pipe")
        os.symlink("lib/pipe", repo / "pipe")
    refused([str(repo)], "pipe", "a FIFO", "not a regular file")


def test_links_inside_the_folder_keep_working(home):
    repo = home / "clone" / "repo"
    os.symlink("lib/util.py", repo / "util_link.py")
    os.symlink("lib", repo / "lib2")
    package = read_package(str(repo))
    assert package.files["util_link.py"] == (repo / "lib" / "util.py").read_text()
    assert sorted(package.files) == ["lib/util.py", "train.py", "util_link.py"]
    assert any(w.startswith("lib2: a link to a folder, not followed") for w in package.warnings)
    # The folder named through a link of its own is fine too.
    os.symlink(str(repo), home / "repo-link")
    assert sorted(read_package(str(home / "repo-link")).files) == sorted(package.files)


def test_a_link_swapped_in_after_the_check_is_not_followed(home, monkeypatch):
    """TOCTOU: the file is checked, then replaced by a link outside before it is read."""
    repo = home / "clone" / "repo"
    checked = code_package._source

    def check_then_swap(root, shown, relative, *rest, **kwargs):
        source = checked(root, shown, relative, *rest, **kwargs)
        if relative == "lib/util.py":
            os.unlink(os.path.join(root, relative))
            os.symlink(str(home / ".ssh" / "id_rsa"), os.path.join(root, relative))
        return source

    monkeypatch.setattr(code_package, "_source", check_then_swap)
    with pytest.raises(PackageError, match="lib/util.py: cannot be read safely") as error:
        read_package(str(repo))
    assert SECRET not in str(error.value)


def test_a_folder_swapped_for_a_link_after_the_check_is_not_followed(home):
    repo = home / "clone" / "repo"
    os.rename(repo / "lib", home / "lib-moved")
    (home / "lib-moved" / "util.py").write_text(SECRET)
    os.symlink(str(home / "lib-moved"), repo / "lib")
    with pytest.raises(OSError):
        os.close(code_package._open_inside(os.path.realpath(repo), "lib/util.py"))
    with pytest.raises(PackageError, match="cannot be read safely"):
        code_package._read_files(os.path.realpath(repo), str(repo), {"lib/util.py": "lib/util.py"})


# --- what looks like a secret --------------------------------------------------------------------

def test_dotfiles_never_travel_and_are_not_warned_of(home):
    repo = home / "clone" / "repo"
    (repo / ".env").write_text(f"TOKEN={SECRET}\n")
    (repo / ".netrc").write_text(f"machine x password {SECRET}\n")
    (repo / ".git").mkdir()
    (repo / ".git" / "config").write_text(f"url = https://u:{SECRET}@x\n")
    code, out, err = dry_run(str(repo))
    assert code == 0 and SECRET not in out and err == "", err


def test_secret_looking_files_are_named_on_stderr_before_the_yaml(home):
    repo = home / "clone" / "repo"
    (repo / "server.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (repo / "api.key").write_text("k\n")
    (repo / "prod.env").write_text("A=1\n")
    (repo / "lib" / "credentials.json").write_text("{}\n")
    (repo / "id_github").write_text("x\n")
    (repo / "id_utils.py").write_text("")  # a module, not a key
    code, out, err = dry_run(str(repo))
    assert code == 0, err
    [line] = err.splitlines()
    assert line.startswith("ddpjob submit: warning: 5 shipped files with a name that secrets often have"), line
    for name in ("server.pem", "api.key", "prod.env", "lib/credentials.json", "id_github"):
        assert name in line
    assert "id_utils.py" not in line and "--exclude" in line and ".ddpjobignore" in line
    # Before anything is created: read_package says it, and run_submit prints it first.
    assert len(read_package(str(repo)).warnings) == 1


@pytest.mark.parametrize("name, content", [("deploy.pem", PRIVATE_KEY), ("notes.txt", "see:\n" + PRIVATE_KEY),
                                           ("id_ed25519", "anything\n"), ("id_rsa", "x\n")])
def test_private_keys_are_refused(home, name, content):
    repo = home / "clone" / "repo"
    (repo / "lib" / name).write_text(content)
    refused([str(repo)], f"lib/{name}:", "private key", "--exclude", "Secret")
    code, _, err = dry_run(str(repo), "--exclude", name)
    assert code == 0, err


# --- .gitignore and .ddpjobignore ----------------------------------------------------------------

def test_gitignore_and_ddpjobignore_leave_files_out_in_that_order(home):
    repo = home / "clone" / "repo"
    for path in ("build/out.py", "sub/build/x.py", "run.log", "keep.log", "top.txt", "sub/top.txt",
                 "data/a/b.csv", "notes/todo.md", "#hash.txt", "lib/skip_me.py"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("x\n")
    (repo / ".gitignore").write_text("# build output\n\nbuild/\n*.log\n/top.txt\ndata/**\nnotes\n\\#hash.txt\n")
    (repo / ".ddpjobignore").write_text("!keep.log\n!build/out.py\nlib/skip_*.py\n")
    assert sorted(read_package(str(repo)).files) == ["keep.log", "lib/util.py", "sub/top.txt", "train.py"]
    # --exclude wins over a negation; --exclude .gitignore: its patterns are not read.
    assert "keep.log" not in read_package(str(repo), exclude=["keep.log"]).files
    files = read_package(str(repo), exclude=[".gitignore", "#hash.txt"]).files
    assert "run.log" in files and "build/out.py" in files and "lib/skip_me.py" not in files


@pytest.mark.parametrize("pattern, paths, left_out", [
    ("*.py", ["a.py", "x/b.py"], [True, True]),
    ("/a.py", ["a.py", "x/a.py"], [True, False]),
    ("x/*.py", ["x/b.py", "x/y/b.py", "z/x/b.py"], [True, False, False]),
    ("**/cache", ["cache", "x/y/cache"], [True, True]),
    ("x/**/b.py", ["x/b.py", "x/y/z/b.py"], [True, True]),
    ("file[0-9].txt", ["file1.txt", "filea.txt"], [True, False]),
])
def test_gitignore_patterns(pattern, paths, left_out):
    rules = code_package.parse_ignore(pattern)
    assert [code_package._left_out(p, False, rules, ()) for p in paths] == left_out


@pytest.mark.parametrize("make", ["/dev/zero", "outside"])
def test_an_ignore_file_that_leaves_the_folder_is_refused(home, make):
    repo = home / "clone" / "repo"
    os.symlink(make if make.startswith("/") else str(home / ".ssh" / "id_rsa"), repo / ".gitignore")
    refused([str(repo)], ".gitignore ->", "outside")
    code, _, err = dry_run(str(repo), "--exclude", ".gitignore")
    assert code == 0, err


# --- over the bound ------------------------------------------------------------------------------

def test_too_large_names_the_size_the_largest_files_and_the_way_out(home):
    repo = home / "clone" / "repo"
    for i, kib in enumerate([400, 300, 200, 150, 100, 2, 1]):
        (repo / "lib" / f"part{i}.py").write_text("x" * (kib * 1024))
    err = refused([str(repo)], "the code is 1.13 MiB (9 files)", "at most 1.00 MiB",
                  "lib/part0.py (400.0 KiB)", "lib/part4.py (100.0 KiB)", "image", "shared volume", "--exclude")
    assert "part5" not in err and "part6" not in err, err


def test_too_large_is_refused_before_anything_is_read(home, monkeypatch):
    repo = home / "clone" / "repo"
    with open(repo / "huge.txt", "wb") as file:
        file.truncate(50 * 1024 * 1024)  # sparse: nothing on disk, 50 MiB to read
    monkeypatch.setattr(code_package, "_read_bytes", lambda *a: pytest.fail("read before the size check"))
    with pytest.raises(PackageError, match=r"the code is 50.00 MiB .*the largest: huge.txt \(50.00 MiB\)"):
        read_package(str(repo))


def test_a_broken_link_inside_ships_nothing_and_is_noted(home):
    repo = home / "clone" / "repo"
    os.symlink("build/generated.py", repo / "generated.py")
    package = read_package(str(repo))
    assert "generated.py" not in package.files
    assert package.warnings == ("generated.py -> build/generated.py: a broken link, not shipped",)
    os.symlink("../../nowhere.py", repo / "out.py")  # broken or not, a link out is refused
    refused([str(repo)], "out.py -> ../../nowhere.py", "outside")
