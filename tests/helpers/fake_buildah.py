"""A stand-in for the `buildah` CLI in the push test, where no registry can be reached: it answers the two
commands `invoke images.push` runs as buildah 1.28 does (its man pages at v1.28.0:
https://github.com/containers/buildah/blob/v1.28.0/docs/buildah-login.1.md and .../docs/buildah-push.1.md) and
records each call (argv and standard input) as a JSON line in $FAKE_BUILDAH_LOG.

- `login --username U --password-stdin REGISTRY`: reads the password from stdin (exit 1 when it is empty);
- `push --digestfile F IMAGE docker://REGISTRY/REPO:TAG`: puts a manifest under REPO:TAG in the AWS emulator
  (ECR's PutImage, what a registry push amounts to) and writes the digest to F, as buildah does.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    stdin = sys.stdin.read() if "--password-stdin" in argv else ""
    with open(os.environ["FAKE_BUILDAH_LOG"], "a") as log:
        log.write(json.dumps({"argv": argv, "stdin": stdin}) + "\n")
    if argv[0] == "login":
        return 0 if stdin else 1
    if argv[0] == "push":
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
