"""A stand-in for the `buildah` CLI in the push tests, where no registry can be reached: it answers the
commands `invoke images.push` and `make up`'s idle-guard step run as buildah 1.28 does (its man pages at v1.28.0:
https://github.com/containers/buildah/blob/v1.28.0/docs/buildah-login.1.md, .../docs/buildah-push.1.md and
.../docs/buildah-build.1.md, of which `bud` is an alias) and records each call (argv and standard input) as a JSON
line in $FAKE_BUILDAH_LOG.

- `login --username U --password-stdin REGISTRY`: reads the password from stdin (exit 1 when it is empty);
- `push --digestfile F IMAGE docker://REGISTRY/REPO:TAG`: puts a manifest under REPO:TAG in the AWS emulator
  (ECR's PutImage, what a registry push amounts to) and writes the digest to F, as buildah does;
- `bud ... --file F --target STAGE [--platform OS/ARCH[/VARIANT]] ... CONTEXT`: builds nothing, but refuses what
  buildah 1.28.2 refuses before it builds, in its order, with its messages and exit code 125 (seen on this machine's
  buildah): a missing context, a `--platform` value not of the form OS/ARCH[/VARIANT][,...], a missing file, a stage
  not in the file; and a folder the stage bind-mounts from the context that is not there, where a real build fails at
  that RUN step.

FAKE_BUILDAH_FAIL=bud makes a build that passes those checks fail as a failed RUN step ends one (exit 1); =push makes
a push fail as a refused one does (exit 125); either is logged first. `helpers.fake_buildah.on_path` puts it first on
a PATH without docker.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def on_path(folder: Path) -> str:
    """PATH with this `buildah` first (in `folder`), and no docker."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "buildah"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return f"{folder}:/usr/bin:/bin"


def bud(argv: list[str]) -> int:
    dockerfile, context = Path(argv[argv.index("--file") + 1]), Path(argv[-1])
    target = argv[argv.index("--target") + 1] if "--target" in argv else None
    platforms = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--platform"]
    if not context.is_dir():
        print(
            f"Error: evaluating symlinks in build context path: lstat {context}: no such file or directory",
            file=sys.stderr,
        )
        return 125
    for value in platforms:
        if not value:
            print("Error: building system context: unable to parse --platform value []", file=sys.stderr)
            return 125
        if not all(re.fullmatch(r"[^/,]+/[^/,]+(/[^/,]+)?", one) for one in value.split(",")):
            print(
                f'Error: building system context: invalid platform syntax for "{value}" (use OS/ARCH[/VARIANT][,...])',
                file=sys.stderr,
            )
            return 125
    if not dockerfile.is_file():
        print(f"Error: stat {dockerfile}: no such file or directory", file=sys.stderr)
        return 125
    stages = re.split(r"^FROM ", dockerfile.read_text(), flags=re.MULTILINE)[1:]
    chosen = (
        [s for s in stages if re.match(rf"\S+ AS {re.escape(target)}\s", s, flags=re.IGNORECASE)]
        if target
        else stages[-1:]
    )
    if not chosen:
        print(f'Error: The target "{target}" was not found in the provided Dockerfile', file=sys.stderr)
        return 125
    for source in re.findall(r"--mount=type=bind,source=([^,\s]+)", chosen[0]):
        if not (context / source).exists():
            print(f"error building: bind mount source {context / source}: no such file or directory", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str]) -> int:
    stdin = sys.stdin.read() if "--password-stdin" in argv else ""
    with open(os.environ["FAKE_BUILDAH_LOG"], "a") as log:
        log.write(json.dumps({"argv": argv, "stdin": stdin}) + "\n")
    if argv[0] == "login":
        return 0 if stdin else 1
    fail = os.environ.get("FAKE_BUILDAH_FAIL")
    if argv[0] == "bud":
        refused = bud(argv)
        if refused or fail != "bud":
            return refused
        print("error building at STEP: exit status 1 (the stand-in: FAKE_BUILDAH_FAIL=bud)", file=sys.stderr)
        return 1
    if argv[0] == "push":
        if fail == "push":
            print(f"Error: pushing image to {argv[-1]} (the stand-in: FAKE_BUILDAH_FAIL=push)", file=sys.stderr)
            return 125
        import boto3

        digest_file = argv[argv.index("--digestfile") + 1]
        reference = argv[-1].removeprefix("docker://")
        repository, tag = reference.split("/", 1)[1].rsplit(":", 1)
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": []}
        ecr = boto3.client("ecr")
        image = ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=tag)
        with open(digest_file, "w") as handle:
            handle.write(image["image"]["imageId"]["imageDigest"])
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
