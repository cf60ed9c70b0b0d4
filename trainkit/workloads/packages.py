"""A script's extra packages (`invoke run --requirements FILE [--wheelhouse DIR] [--require-hashes]`): what the file
may say, checked on this machine before anything is created (and again on the node), and the install every node does
before torchrun starts.

The file is read as pip reads it (pip's Requirements File Format,
https://pip.pypa.io/en/stable/reference/requirements-file-format/: a line ending in `\\` continues on the next; `#` at
the start or after whitespace begins a comment). What it may hold:

- package lines, each with pip's per-requirement `--hash=ALG:DIGEST` options when it pins hashes;
- nothing else that starts with `-`. An option line (`--index-url`, `--extra-index-url`, `-f`, `--trusted-host`,
  `--pre`, `--no-require-hashes`, `-r`, `-c` ...) is one of pip's global options, which apply to the whole install
  (the same page, "Global options"): it would send every node to another package source or turn hash checking off.
  A requirement line's other option (`--config-settings`) configures a source build, which a wheel does not need;
- no credentials in a URL (`https://user:token@host/...`): the lines travel in the workload (TRAINKIT_WORKLOAD: the
  pod spec, Batch's job records, S3), where anyone who can read the job reads them.

Hashes: pip checks every archive against the file's hashes as soon as one line carries `--hash`, and then wants a
matching hash for every package it installs, dependencies included (pip's "Secure installs", Hash-checking Mode,
https://pip.pypa.io/en/stable/topics/secure-installs/#hash-checking-mode). The node passes `--require-hashes` to pip
whenever a line has a hash, so no option can turn that off; `--require-hashes` on `invoke run` refuses a file with a
line that has none.

The install: pip --target a folder named by the hash of what goes in it (the lines, the wheelhouse's path and wheels,
the Python version), reused while it exists so a restart does not install again, in a cache of this user's own,
`<temp dir>/trainkit-packages-<uid>`, made 0700; one that another user owns or can write to is refused, since what is
in it is imported by the job.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from trainkit.errors import SpecError
from trainkit.paths import private_folder

PACKAGES_DIR = "trainkit-packages"
INSTALL_TIMEOUT_S = 1800
COMMENT = re.compile(r"(^|\s)#.*$")
URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@]+)@")
# What may stand before the @ of a URL without being a secret: the `git` user of an ssh URL (`git+ssh://git@host/`),
# and an environment variable pip expands on the node (`https://${TOKEN}@host/`: pip's requirements file format,
# "Using Environment Variables"), which keeps the secret out of the file.
NO_SECRET_USERINFO = re.compile(r"git|\$\{[A-Z0-9_]+\}(:\$\{[A-Z0-9_]+\})?")
# pip's report of an archive whose hash the file does not list: the requirement, then `Expected ALG HEX`, more
# expected hashes on `Expected or HEX` lines, and `Got HEX` (pip 26.3 pip/_internal/exceptions/hashes.py:191-215).
HASH_MISMATCH = re.compile(
    r"^\s*(?P<package>\S+) from .*\n\s*Expected (?P<algorithm>\w+) \w+\n(?:\s*(?:Expected\s+)?or \w+\n)*"
    r"\s*Got\s+(?P<got>\w+)",
    re.M,
)
LOCAL_PATHS = ("-e", "--editable", ".", "/", "file:")
WHEELHOUSE_ADVICE = "put the wheels in a folder and give it as --wheelhouse (eks and batch: a folder on FSx)"


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) for each requirement line of the file, continuations joined, comments dropped."""
    found, pending, first = [], [], 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            first = number
        comment = raw.lstrip().startswith("#")
        if raw.endswith("\\") and not comment:
            pending.append(raw[:-1])
            continue
        pending.append(" " + raw if comment else raw)  # a comment ends a continuation (and is dropped below)
        found.append((first, "".join(pending)))
        pending = []
    if pending:
        found.append((first, "".join(pending)))
    stripped = ((number, COMMENT.sub("", line).strip()) for number, line in found)
    return [(number, line) for number, line in stripped if line]


def without_credentials(line: str) -> str:
    return URL_CREDENTIALS.sub(r"\g<scheme>***@", line)


def refusal(line: str, where: str) -> str | None:
    """Why a requirement line cannot go to the nodes, in a sentence that starts with `where`; None when it can."""
    if line.startswith(LOCAL_PATHS):
        return (
            f"{where}: {line!r} names a path on this machine, which the nodes cannot see; build it into a wheel and "
            "give its folder as --wheelhouse"
        )
    if any(not NO_SECRET_USERINFO.fullmatch(m["userinfo"]) for m in URL_CREDENTIALS.finditer(line)):
        return (
            f"{where}: {without_credentials(line)!r} carries credentials in its URL, which would travel with the job "
            f"(its spec, the pod spec, Batch's job records, S3); {WHEELHOUSE_ADVICE}, or keep the credentials on the "
            "nodes (a netrc file or a keyring pip reads there) and drop them from the line"
        )
    if line.startswith("-"):
        return (
            f"{where}: {line!r} is a pip option, which would apply to every package of the install (another index or "
            f"link source, trusted hosts, pre-releases, no hash checking); list packages only (each may carry "
            f"--hash=sha256:...), and {WHEELHOUSE_ADVICE} or set the index in pip's configuration on the nodes "
            "(pip.conf or PIP_INDEX_URL in the image)"
        )
    options = line.split()
    while options and not options[0].startswith("-"):  # pip: the options start at the first word with a dash
        options.pop(0)
    while options:
        option = options.pop(0)
        if option == "--hash" and options:  # `--hash ALG:DIGEST`, as optparse also reads it
            options.pop(0)
        elif not option.startswith("--hash="):
            return (
                f"{where}: {option!r} is not accepted on a requirement line (only --hash=ALG:DIGEST is); drop it, or "
                "build the package into a wheel and give its folder as --wheelhouse"
            )
    return None


def hashed(line: str) -> bool:
    return any(word == "--hash" or word.startswith("--hash=") for word in line.split())


def read_requirements(path: str | None, require_hashes: bool = False) -> tuple[str, ...]:
    """The requirement lines of `path`, each checked (see the module's docstring); with `require_hashes`, each must
    carry a --hash."""
    if path is None:
        if require_hashes:
            raise SpecError("--require-hashes checks the hashes of --requirements; give --requirements too")
        return ()
    file = Path(path).expanduser()
    if not file.is_file():
        raise SpecError(f"--requirements {path}: no such file; give a pip requirements file")
    lines = logical_lines(file.read_text())
    for number, line in lines:
        reason = refusal(line, f"--requirements {path}, line {number}")
        if reason:
            raise SpecError(reason)
        if require_hashes and not hashed(line):
            raise SpecError(
                f"--require-hashes: --requirements {path}, line {number}: {line!r} has no --hash; add one for each "
                "archive pip may pick (`pip hash FILE` prints it), or drop --require-hashes"
            )
    if not lines:
        raise SpecError(f"--requirements {path} lists no package; drop --requirements or add one")
    return tuple(line for _, line in lines)


def package_cache() -> Path:
    """This user's own folder for installed requirements, under the temporary folder (TMPDIR moves it)."""
    root = Path(tempfile.gettempdir()) / f"{PACKAGES_DIR}-{os.getuid()}"
    return private_folder(root, "the package cache", "remove it (or have its owner remove it), or set TMPDIR elsewhere")


def install(requirements: tuple[str, ...], wheelhouse: str | None) -> Path:
    """pip install --target a folder named by what goes in it (reused when complete); only from `wheelhouse` when
    given; hash-checked when a line has a hash. A failure says pip's last words and what to change."""
    for line in requirements:  # the workload may have been written by other means than `invoke run`
        reason = refusal(line, "--requirements")
        if reason:
            raise SpecError(reason)
    if wheelhouse is not None and not Path(wheelhouse).is_dir():
        raise SpecError(f"--wheelhouse {wheelhouse}: no such folder on this node; give a folder of wheels")
    wheels = sorted(f"{w.name}:{w.stat().st_size}" for w in Path(wheelhouse).glob("*")) if wheelhouse else []
    where = str(Path(wheelhouse).resolve()) if wheelhouse else "index"
    key = hashlib.sha256("\n".join([*requirements, where, *wheels, sys.version]).encode()).hexdigest()
    target = package_cache() / key[:16]
    if target.is_dir():
        return target / "site"
    partial = target.with_name(f".{target.name}-{uuid.uuid4().hex[:8]}")
    partial.mkdir()
    listed = partial / "requirements.txt"
    listed.write_text("\n".join(requirements) + "\n")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
    command += ["--target", str(partial / "site"), "-r", str(listed)]
    if any(hashed(line) for line in requirements):
        # Hash-checked wheels only: a source archive would be built in an isolated environment whose build
        # requirements pip fetches without any hash check, and building runs their code (pip's "Secure installs":
        # hash-checking mode is paired with --only-binary :all:).
        command += ["--require-hashes", "--only-binary", ":all:"]
    if wheelhouse is not None:
        command += ["--no-index", "--find-links", str(wheelhouse)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode:
        shutil.rmtree(partial, ignore_errors=True)
        said = done.stderr.strip() or done.stdout.strip()
        source = f"from {wheelhouse}" if wheelhouse else "from the package index"
        mismatch = HASH_MISMATCH.search(said)
        if mismatch:
            raise SpecError(
                f"--requirements: {mismatch['package']} {source} matches no --hash of its line (its hash is "
                f"{mismatch['algorithm']}:{mismatch['got']}); if that wheel is the one you meant, put its hash in the "
                "file (`pip hash WHEEL` prints it), else replace the wheel"
            )
        words = said.splitlines()[-1:] or ["no output"]
        raise SpecError(f"--requirements: pip could not install them {source} ({words[0]}); fix the file or the wheels")
    try:
        os.replace(partial, target)  # a node that finished first already put the same packages there
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    return target / "site"
