"""Your code as a ConfigMap: a script or a folder read from disk, checked, and built into the
ConfigMap and the volume that put it back together in every pod (``ddpjob submit``).

Reading is bounded (file count, total size) and refuses what a ConfigMap cannot carry, with the
way out named: more than 1 MiB, a file that is not UTF-8 text (data belongs in the image or a
volume; ``--exclude`` leaves such files out), a name a ConfigMap key cannot hold. ConfigMap keys
cannot contain ``/``, so a folder's ``pkg/util.py`` is stored under the key ``pkg__util.py`` and
the volume's ``items`` map each key back to its path.

The folder is untrusted input (a cloned repository): only regular files inside it travel. A
link that leads out of it (``notes.txt -> ../../.ssh/id_rsa``, ``env.txt -> /proc/self/environ``),
to something left out, or to anything but a regular file is refused, naming the link and its
target (issue 35); what is read is opened one path component at a time with ``O_NOFOLLOW``, so
a link swapped in after the check is not followed either. A private key is refused; other files
that look like secrets are named in the package's warnings. ``.gitignore`` and ``.ddpjobignore``
leave files out as they do for git and ``docker build``.
"""
from __future__ import annotations

import fnmatch
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: The API server refuses a ConfigMap whose keys and values together exceed this (the same
#: bound as a Secret's, in ``ValidateConfigMap``).
CONFIGMAP_MAX_BYTES = 1024 * 1024
#: Reading stops here, whatever the sizes: a folder of thousands of files is not "a script".
MAX_FILES = 500
#: Never packaged: version control, virtual environments, caches, and every dotfile (``.env``,
#: ``.netrc``, ``.git/``). No ignore file brings them back.
ALWAYS_EXCLUDED = (".*", "__pycache__", "*.pyc", "*.pyo", "venv", "node_modules")
#: Read from the folder's top, in this order, as one list of gitignore patterns (the last match
#: decides, so ``!pattern`` in ``.ddpjobignore`` brings back what ``.gitignore`` leaves out).
IGNORE_FILES = (".gitignore", ".ddpjobignore")
MAX_IGNORE_FILE_BYTES = 64 * 1024
#: Refused, by name or by content: a private key in a ConfigMap is readable by everyone who may
#: read the namespace's ConfigMaps, and by every pod that mounts it.
PRIVATE_KEY_NAMES = ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk")
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
#: Shipped, but named on stderr before anything is created: they often hold secrets.
SECRET_LOOKING = ("*.pem", "*.key", "*.env", "env", "*.netrc", "_netrc", "credentials*", "*credentials.json",
                  "kubeconfig", "*.kubeconfig")  # and id_NAME without an extension (an ssh key of any name)
KEY_SEPARATOR = "__"
_KEY_CHARACTERS = re.compile(r"^[-._a-zA-Z0-9]+$")
SIZE_ALTERNATIVES = ("leave files out with --exclude PATTERN, bake the code into an image (--image "
                     "YOUR_IMAGE and a DDPJob whose args name the script's path in it), or put it on "
                     "a shared volume (a PersistentVolumeClaim mounted with spec.volumeMounts)")


class PackageError(Exception):
    """The code cannot travel as a ConfigMap; the message says why and what to do instead."""


@dataclass(frozen=True)
class CodePackage:
    """The files to ship: path relative to the package root (``/``-separated) -> text."""

    files: Mapping[str, str]
    entry: str  # the script the pods run, one of ``files``
    warnings: Sequence[str] = ()  # one line each, for the user before anything is created

    def key(self, path: str) -> str:
        return path.replace("/", KEY_SEPARATOR)

    @property
    def size(self) -> int:
        """What the API server counts: every key and every value, in bytes."""
        return sum(len(self.key(p)) + len(text.encode()) for p, text in self.files.items())


def mib(size: int) -> str:
    return f"{size / (1024 * 1024):.2f} MiB"


def _size(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB" if size < 1024 * 1024 else mib(size)


def _too_large(sizes: Mapping[str, int], where: str = "") -> PackageError:
    """The total, the largest files and the way out, in one line."""
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:5]
    return PackageError(f"{where + ': ' if where else ''}the code is {mib(total)} ({len(sizes)} file"
                        f"{'s' * (len(sizes) != 1)}), a ConfigMap holds at most {mib(CONFIGMAP_MAX_BYTES)} "
                        f"(keys and contents); the largest: {', '.join(f'{p} ({_size(s)})' for p, s in largest)}; "
                        f"{SIZE_ALTERNATIVES}")


@dataclass(frozen=True)
class IgnoreRule:
    """One gitignore pattern: matched against the whole path when anchored (a ``/`` at its start
    or middle), else against the last component, at any depth."""

    pattern: re.Pattern
    negated: bool
    folders_only: bool
    anchored: bool

    def matches(self, relative: str, is_folder: bool) -> bool:
        if self.folders_only and not is_folder:
            return False
        return bool(self.pattern.fullmatch(relative if self.anchored else relative.rsplit("/", 1)[-1]))


def _glob_regex(glob: str) -> str:
    """gitignore's glob: ``*`` and ``?`` stop at ``/``, ``**`` crosses folders, ``[...]`` a class."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 2:]:
            end = glob.index("]", i + 2)
            body = glob[i + 1:end]
            negated = body[0] in "!^"
            out.append("[" + "^" * negated + re.escape(body[negated:]).replace(r"\-", "-") + "]")
            i = end + 1
        elif glob[i] == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def parse_ignore(text: str) -> list[IgnoreRule]:
    """gitignore's syntax: blank lines and ``#`` comments skipped, ``!`` negates, a trailing ``/``
    matches folders only, a leading ``/`` anchors to the folder's top, ``\\#`` and ``\\!`` escape."""
    rules = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated or line[:2] in ("\\#", "\\!") else line
        folders_only = line.endswith("/")
        line = line.rstrip("/")
        if line:
            rules.append(IgnoreRule(re.compile(_glob_regex(line.lstrip("/"))), negated, folders_only, "/" in line))
    return rules


def _left_out(relative: str, is_folder: bool, rules: Sequence[IgnoreRule], exclude: Sequence[str]) -> bool:
    """Left out itself, or inside a folder left out (which no ``!pattern`` undoes, as in git)."""
    parts = relative.split("/")
    for depth, name in enumerate(parts, 1):
        path, folder = "/".join(parts[:depth]), depth < len(parts) or is_folder
        if any(fnmatch.fnmatch(name, p) for p in ALWAYS_EXCLUDED):
            return True
        verdict = False
        for rule in rules:
            if rule.matches(path, folder):
                verdict = not rule.negated
        if verdict or any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in exclude):
            return True
    return False


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return kind
    return "not a regular file"


def _source(root: str, shown: str, relative: str, rules: Sequence[IgnoreRule], exclude: Sequence[str],
            shipped: bool = True) -> str | None:
    """The regular file inside ``root`` that ``relative`` stands for (itself, or where its link
    chain ends), as a path relative to ``root``; None for a broken link inside (nothing to ship);
    PackageError for anything else. A file that is ``shipped`` must not be a link to one left
    out (``notes.txt -> .env`` would ship ``.env``)."""
    full = os.path.join(root, relative)
    source = relative
    if os.path.islink(full):
        link = f"{relative} -> {os.readlink(full)}"
        target = os.path.realpath(full)
        if not _within(target, root):
            raise PackageError(f"{link}: a link to {target}, outside {shown}; only files inside the folder "
                               f"travel: --exclude {relative!r}, or copy the file in")
        source = os.path.relpath(target, root).replace(os.sep, "/")
        if not os.path.lexists(target):
            return None
        if shipped and _left_out(source, os.path.isdir(target), rules, exclude):
            raise PackageError(f"{link}: a link to {source}, which is left out (a dotfile, a cache, an ignore "
                               f"pattern or --exclude); --exclude {relative!r}, or copy the file in")
    try:
        mode = os.lstat(os.path.join(root, source)).st_mode
    except OSError as error:
        raise PackageError(f"{relative}: cannot be read ({error.strerror}); --exclude {relative!r}") from None
    if not stat.S_ISREG(mode):
        raise PackageError(f"{relative}: {_kind(mode)}{'' if source == relative else f' ({source})'}, not a "
                           f"regular file; only files travel: --exclude {relative!r}")
    return source


def _open_inside(root: str, source: str) -> int:
    """A descriptor of ``root/source``, each component opened with ``O_NOFOLLOW`` below the one
    before: what is opened is inside ``root`` even if a link was swapped in after the check."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if os.open not in os.supports_dir_fd or not hasattr(os, "O_NOFOLLOW"):  # Windows: the type check only
        return os.open(os.path.join(root, source), flags | getattr(os, "O_BINARY", 0))
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in source.split("/")[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.open(source.rsplit("/", 1)[-1], flags, dir_fd=folder)
    finally:
        os.close(folder)


def _read_bytes(root: str, source: str, relative: str, budget: int) -> bytes:
    """At most ``budget + 1`` bytes of a regular file inside ``root``."""
    try:
        descriptor = _open_inside(root, source)
    except OSError as error:
        raise PackageError(f"{relative}: cannot be read safely ({error.strerror}: a link or a file "
                           f"changed while it was read); --exclude {relative!r}") from None
    with os.fdopen(descriptor, "rb") as file:
        mode = os.fstat(file.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise PackageError(f"{relative}: {_kind(mode)}, not a regular file; only files travel: "
                               f"--exclude {relative!r}")
        return file.read(budget + 1)


def _decode(raw: bytes, relative: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PackageError(f"{relative}: not UTF-8 text; a ConfigMap of code carries text files "
                           f"only. Leave it out with --exclude {relative!r}, or ship data in the "
                           "image or on a volume") from None


def _ignore_rules(root: str, shown: str, exclude: Sequence[str]) -> list[IgnoreRule]:
    """The patterns of the folder's top-level ignore files; ``--exclude .gitignore`` skips one."""
    rules: list[IgnoreRule] = []
    for name in IGNORE_FILES:
        if os.path.lexists(os.path.join(root, name)) and not any(fnmatch.fnmatch(name, p) for p in exclude):
            source = _source(root, shown, name, (), (), shipped=False)
            if source is None:
                continue
            raw = _read_bytes(root, source, name, MAX_IGNORE_FILE_BYTES)
            if len(raw) > MAX_IGNORE_FILE_BYTES:
                raise PackageError(f"{name}: more than {MAX_IGNORE_FILE_BYTES // 1024} KiB of patterns")
            rules += parse_ignore(_decode(raw, name))
    return rules


def _walk(root: str, shown: str, rules: Sequence[IgnoreRule], exclude: Sequence[str],
          notes: list[str]) -> Iterable[tuple[str, str]]:
    """(path in the package, the file inside ``root`` it is read from), sorted. A linked folder
    is never entered (it could loop or leave the folder): one that leaves it is refused, one
    inside is noted (its files travel under their own path)."""
    for folder, subfolders, names in os.walk(root):
        relative_folder = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if relative_folder == "." else relative_folder + "/"
        kept = []
        for name in sorted(subfolders):
            relative = prefix + name
            if _left_out(relative, True, rules, exclude):
                continue
            full = os.path.join(root, relative)
            if not os.path.islink(full):
                kept.append(name)
                continue
            target = os.path.realpath(full)
            if not _within(target, root):
                raise PackageError(f"{relative} -> {os.readlink(full)}: a link to the folder {target}, outside "
                                   f"{shown}; only files inside the folder travel: --exclude {relative!r}")
            notes.append(f"{relative}: a link to a folder, not followed; its files travel only as "
                         f"{os.path.relpath(target, root).replace(os.sep, '/')}/")
        subfolders[:] = kept
        for name in sorted(names):
            relative = prefix + name
            if _left_out(relative, False, rules, exclude):
                continue
            source = _source(root, shown, relative, rules, exclude)
            if source is None:
                notes.append(f"{relative} -> {os.readlink(os.path.join(root, relative))}: a broken link, not shipped")
            else:
                yield relative, source


def _default_entry(files: Mapping[str, str], root: str) -> str:
    for candidate in ("train.py", "main.py"):
        if candidate in files:
            return candidate
    top_level = [p for p in files if "/" not in p and p.endswith(".py")]
    if len(top_level) == 1:
        return top_level[0]
    raise PackageError(f"{root}: which script do the pods run? No train.py or main.py, and "
                       f"{len(top_level)} top-level .py files: name one with --entry FILE")


def _read_files(root: str, shown: str, sources: Mapping[str, str]) -> dict[str, str]:
    """Every file's text, the sizes on disk checked first so that a folder over the bound is
    refused with its largest files named before any is read."""
    sizes = {}
    for relative, source in sources.items():
        try:
            sizes[relative] = len(relative.replace("/", KEY_SEPARATOR)) + os.stat(os.path.join(root, source)).st_size
        except OSError as error:
            raise PackageError(f"{relative}: cannot be read ({error.strerror}); --exclude {relative!r}") from None
    if sum(sizes.values()) > CONFIGMAP_MAX_BYTES:
        raise _too_large(sizes, shown)
    files: dict[str, str] = {}
    budget = CONFIGMAP_MAX_BYTES
    for relative, source in sources.items():
        raw = _read_bytes(root, source, relative, budget)
        if len(raw) > budget:  # it grew since, or a size the file system does not tell
            raise _too_large({**sizes, relative: len(relative.replace("/", KEY_SEPARATOR)) + len(raw)}, shown)
        files[relative] = _decode(raw, relative)
        budget -= len(raw)
    return files


def read_package(path: str, *, entry: str | None = None, exclude: Sequence[str] = ()) -> CodePackage:
    """A script (the package is that one file) or a folder (every text file in it but the
    excluded), checked against what a ConfigMap can hold."""
    notes: list[str] = []
    if os.path.isfile(path):
        if entry is not None:
            raise PackageError(f"--entry {entry}: only with a folder; {path} is a file (the script itself)")
        folder, name = os.path.split(os.path.abspath(path))
        root = os.path.realpath(folder)
        source = _source(root, folder, name, (), ())
        if source is None:
            raise PackageError(f"{path}: a broken link")
        files = _read_files(root, path, {name: source})
        package = CodePackage(files, name)
    elif os.path.isdir(path):
        root = os.path.realpath(path)
        rules = _ignore_rules(root, path, exclude)
        sources: dict[str, str] = {}
        for relative, source in _walk(root, path, rules, exclude, notes):
            if len(sources) == MAX_FILES:
                raise PackageError(f"{path}: more than {MAX_FILES} files; {SIZE_ALTERNATIVES}")
            sources[relative] = source
        if not sources:
            raise PackageError(f"{path}: no files to package (all excluded, or an empty folder)")
        files = _read_files(root, path, sources)
        chosen = entry.strip("/").replace(os.sep, "/") if entry else _default_entry(files, path)
        if chosen not in files:
            raise PackageError(f"--entry {entry}: not a file of {path} (its files: "
                               f"{', '.join(sorted(files)[:10])}{', ...' if len(files) > 10 else ''})")
        package = CodePackage(files, chosen)
    else:
        raise PackageError(f"{path}: no such file or folder")
    check_package(package)
    return CodePackage(package.files, package.entry, tuple(notes) + tuple(secret_warnings(package.files)))


def _looks_secret(relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1].lower()
    return any(fnmatch.fnmatchcase(name, p) for p in SECRET_LOOKING) or (name.startswith("id_") and "." not in name)


def secret_warnings(files: Mapping[str, str]) -> list[str]:
    """One line naming the shipped files that look like secrets (none: no line)."""
    suspects = sorted(p for p in files if _looks_secret(p))
    if not suspects:
        return []
    return [f"{len(suspects)} shipped file{'s' * (len(suspects) != 1)} with a name that secrets often have "
            f"will be in the ConfigMap, readable by whoever may read the namespace's ConfigMaps: "
            f"{', '.join(suspects)}; if they are, leave them out (--exclude, .ddpjobignore) and use a Secret"]


def check_package(package: CodePackage) -> None:
    """Names a ConfigMap key can hold, no two files on one key, no private key, within the size bound."""
    keys: dict[str, str] = {}
    for relative, text in package.files.items():
        key = package.key(relative)
        if not _KEY_CHARACTERS.match(key) or len(key) > 253:
            raise PackageError(f"{relative}: a ConfigMap key holds only letters, digits, '-', '_' and "
                               "'.' (at most 253), folders joined by '__'; rename it or --exclude it")
        if key in keys:
            raise PackageError(f"{relative} and {keys[key]} would share the ConfigMap key {key!r}; "
                               "rename one or --exclude it")
        keys[key] = relative
        found = _PRIVATE_KEY.search(text)
        if found or relative.rsplit("/", 1)[-1] in PRIVATE_KEY_NAMES:
            what = f"holds a private key ({found.group()})" if found else "named like an ssh private key"
            raise PackageError(f"{relative}: {what}; a ConfigMap would show it to whoever may read the namespace's "
                               f"ConfigMaps: leave it out (--exclude {relative!r} or .ddpjobignore) and give the "
                               "pods a Secret if they need it")
    if package.size > CONFIGMAP_MAX_BYTES:
        raise _too_large({p: len(package.key(p)) + len(t.encode()) for p, t in package.files.items()})


def build_configmap(package: CodePackage, name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "data": {package.key(p): text for p, text in sorted(package.files.items())}}


def build_volume(package: CodePackage, volume_name: str, configmap_name: str) -> dict[str, Any]:
    """The pod volume that lays the files out as on disk: each key back at its path."""
    items = [{"key": package.key(p), "path": p} for p in sorted(package.files)]
    return {"name": volume_name, "configMap": {"name": configmap_name, "items": items}}
