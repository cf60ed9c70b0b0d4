"""Writes pytorchjob-v1.json from the training operator's CRD file, with where it came from.

    git -C <kubeflow/trainer clone> show v1.9.4:manifests/base/crds/kubeflow.org_pytorchjobs.yaml > crd.yaml
    python -m tests.schemas.generate crd.yaml --tag v1.9.4 --commit <sha of the tag>

Keeps the `v1` version's openAPIV3Schema as it is, less the `description` texts (upstream's prose, and
most of the file's size); tests/helpers/crd.py turns it into a strict validator.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import yaml

OUTPUT = Path(__file__).with_name("pytorchjob-v1.json")
CRD_PATH = "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"


def without_descriptions(node):
    if isinstance(node, dict):
        return {key: without_descriptions(value) for key, value in node.items() if key != "description"}
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd", type=Path, help=f"the CRD file ({CRD_PATH} at the tag)")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--commit", required=True)
    args = parser.parse_args(argv)
    text = args.crd.read_bytes()
    crd = yaml.safe_load(text)
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == "PyTorchJob"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    body = {
        "source": {
            "repository": "github.com/kubeflow/trainer",
            "tag": args.tag,
            "commit": args.commit,
            "path": CRD_PATH,
            "sha256": hashlib.sha256(text).hexdigest(),
            "generator": "tests/schemas/generate.py (descriptions removed)",
        },
        "openAPIV3Schema": without_descriptions(version["schema"]["openAPIV3Schema"]),
    }
    OUTPUT.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
