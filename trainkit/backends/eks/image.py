"""The job's container image, checked before anything is created: it exists in ECR, it holds trainkit's pod entry
point, and it is kept while the run may resume on it.

Whether an image holds the entry point is read from its OCI config's labels, the way SageMaker reads an image's
`com.amazonaws.sagemaker.capabilities.*` labels: containers/train/Dockerfile sets `POD_ENTRY_LABEL` to the module the
pods run (render.POD_ENTRY), and an image built `FROM` it inherits the label (OCI image spec, config.md: Labels).
The config is a blob the manifest names; ECR hands out blobs by `GetDownloadUrlForLayer` (a pre-signed S3 URL) for
any digest an image in the repository references, which is how a registry client's pull fetches the config too.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import urllib.request

from training.spec import Job
from trainkit.backends.eks.render import POD_ENTRY
from trainkit.errors import SpecError
from trainkit.infra import outputs

ECR_IMAGE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com/(?P<repo>[^:@]+)(?::(?P<tag>[^@]+))?$"
)
POD_ENTRY_LABEL = "dev.trainkit.pod-entry"
POD_ENTRY_MODULE = POD_ENTRY[POD_ENTRY.index("-m") + 1]

# What BatchGetImage may answer with (the OCI image spec's and Docker's registry media types): an index or a
# manifest list is resolved to its linux/amd64 image, the platform of the GPU node groups.
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
PLATFORM = {"os": "linux", "architecture": "amd64"}
CONFIG_LIMIT = 4 * 1024 * 1024  # an image config is a few KiB; refuse to read more than this


def check_image(job: Job, ecr=None, tag_run: bool = True) -> str | None:
    """The job's image must exist in ECR and hold the pod entry point (`check_image_ref`); `tag_run`: also tag it
    for the run (a training run, which may be resumed on it)."""
    note, found = check_image_ref(job.placement.image, ecr)
    if found is None or not tag_run:
        return note
    ecr, repository, record = found
    return tag_for_run(ecr, repository, record, job.run.run_id)


def image_problems(job: Job, ecr) -> list[str]:
    """A preflight's view of `check_image` (no run tag yet): the problem, if any, as a line of the preflight's list;
    a note (an image outside ECR) on stderr."""
    try:
        note = check_image(job, ecr, tag_run=False)
    except SpecError as error:
        return [str(error)]
    if note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    return []


def check_image_ref(image: str, ecr=None, fetch=urllib.request.urlopen) -> tuple[str | None, tuple | None]:
    """(note, (ecr client, repository, the image's BatchGetImage record) when the image is in ECR). An image from
    another registry is the user's to vouch for (a note); one missing from ECR, or without the pod entry point, is an
    error that says what to do."""
    match = ECR_IMAGE.match(image)
    if match is None:
        if image == outputs.UNRECORDED_IMAGE and not outputs.load_outputs().recorded:
            raise SpecError(
                "no training image: run `make up PROFILE=aws` (records the ECR repository), then "
                "`invoke images.build && invoke images.push`, or pass --image"
            )
        return (
            f"image {image} is not in ECR; not checked (the nodes must be able to pull it, and it must hold "
            f"trainkit's pod entry point, `python -m {POD_ENTRY_MODULE}`)",
            None,
        )
    import boto3
    from botocore.exceptions import ClientError

    ecr = ecr or boto3.client("ecr", region_name=match["region"])
    tag = match["tag"] or "latest"
    try:
        ecr.describe_images(repositoryName=match["repo"], imageIds=[{"imageTag": tag}])
    except ClientError as error:
        code = error.response["Error"]["Code"]
        if code not in ("ImageNotFoundException", "RepositoryNotFoundException"):
            raise
        raise SpecError(
            f"image {image} is not in ECR ({code}): build and push it (`invoke images.build && "
            "invoke images.push`), or pass --image with a tag that exists"
        ) from None
    record = _image(ecr, match["repo"], {"imageTag": tag})  # read once: the label check and the run tag use it
    check_pod_entry(image, image_labels(ecr, match["repo"], record, fetch))
    return None, (ecr, match["repo"], record)


def check_pod_entry(image: str, labels: dict[str, str]) -> None:
    """The image must say it runs trainkit's pod entry point (the label trainkit's Dockerfile sets)."""
    found = labels.get(POD_ENTRY_LABEL)
    if found == POD_ENTRY_MODULE:
        return
    what = f"its label {POD_ENTRY_LABEL} is {found!r}" if found else f"it has no {POD_ENTRY_LABEL} label"
    raise SpecError(
        f"image {image} does not hold trainkit's pod entry point ({what}; the pods run `python -m "
        f"{POD_ENTRY_MODULE}`): build it FROM trainkit's training image (`invoke images.build`), or install this "
        f'trainkit in it and add `LABEL {POD_ENTRY_LABEL}="{POD_ENTRY_MODULE}"`'
    )


def image_labels(ecr, repository: str, record: dict, fetch=urllib.request.urlopen) -> dict[str, str]:
    """The labels of the linux/amd64 image of a BatchGetImage `record`: its manifest, then its config blob (which
    must say linux/amd64 too)."""
    tag = record["imageId"].get("imageTag", record["imageId"].get("imageDigest"))
    manifest = json.loads(record["imageManifest"])
    if "manifests" in manifest:  # an index: the image for the nodes' platform
        chosen = [
            m for m in manifest["manifests"] if all(m.get("platform", {}).get(k) == v for k, v in PLATFORM.items())
        ]
        if not chosen:
            raise SpecError(f"image {repository}:{tag} has no linux/amd64 image, the GPU nodes' platform")
        manifest = json.loads(_image(ecr, repository, {"imageDigest": chosen[0]["digest"]})["imageManifest"])
    digest = manifest["config"]["digest"]
    url = ecr.get_download_url_for_layer(repositoryName=repository, layerDigest=digest)["downloadUrl"]
    with fetch(url, timeout=30) as answer:
        body = answer.read(CONFIG_LIMIT + 1)
    algorithm, _, expected = digest.partition(":")
    if len(body) > CONFIG_LIMIT or algorithm != "sha256" or hashlib.sha256(body).hexdigest() != expected:
        raise SpecError(f"image {repository}:{tag}: its config blob {digest} did not download intact; submit again")
    config = json.loads(body)
    # A single-platform image says its platform in its config (OCI image spec, config.md: `architecture` and `os`
    # are required); one built on an arm64 laptop would start on the nodes with "exec format error".
    built_for = {key: config.get(key) for key in PLATFORM}
    if built_for != PLATFORM:
        raise SpecError(
            f"image {repository}:{tag} is built for {built_for['os']}/{built_for['architecture']} and the GPU nodes "
            "run linux/amd64: build it with `invoke images.build` (it passes --platform linux/amd64), or with "
            "`--platform linux/amd64` yourself, and push it again"
        )
    return config.get("config", {}).get("Labels") or {}


def _image(ecr, repository: str, image_id: dict) -> dict:
    answer = ecr.batch_get_image(
        repositoryName=repository, imageIds=[image_id], acceptedMediaTypes=list(MANIFEST_TYPES)
    )
    if not answer["images"]:
        failure = (answer.get("failures") or [{}])[0]
        raise SpecError(f"image {repository} {image_id}: {failure.get('failureReason', 'not found')}")
    return answer["images"][0]


def tag_for_run(ecr, repository: str, image: dict, run_id: str) -> str | None:
    """Tag the image run-<run id> as well (the same manifest under a second tag): the repository's lifecycle rule
    keeps images with run- tags, so the image stays while the run can be resumed (terraform/modules/ecr)."""
    from botocore.exceptions import ClientError

    run_tag = f"run-{run_id}"
    try:
        (tagged,) = ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": run_tag}])["imageDetails"]
    except ClientError as error:
        if error.response["Error"]["Code"] != "ImageNotFoundException":
            raise
    else:  # tags are immutable: a run resumed on another image keeps the first one tagged
        same = tagged["imageDigest"] == image["imageId"]["imageDigest"]
        return None if same else f"{run_tag} already tags the image this run started with; that one stays kept"
    manifest = {"imageManifest": image["imageManifest"]}
    if image.get("imageManifestMediaType"):
        manifest["imageManifestMediaType"] = image["imageManifestMediaType"]
    ecr.put_image(repositoryName=repository, imageTag=run_tag, **manifest)
    return None
