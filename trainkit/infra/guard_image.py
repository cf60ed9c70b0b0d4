"""The platform's own image (containers/train/Dockerfile's stage `guard`: the idle guard and the etcd issuer) between
`make up PROFILE=aws`'s two stacks: built for the nodes' platform and pushed to its own ECR repository when its tag is
not there yet, and recorded for the platform stack's etcd issuer and idle guard (trainkit/infra/lifecycle.py `up`).
The build and push are trainkit/infra/images.py's."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from botocore.exceptions import BotoCoreError, ClientError

from trainkit.errors import SpecError
from trainkit.infra import images, outputs
from trainkit.infra.images import Runner

PLATFORM_RETRY = "invoke infra.up --profile aws --stack platform"  # what applies the guard's image (and the platform)


class GuardImageFailed(SpecError):
    """The guard's image did not build or push: `make up` applies the platform stack all the same, then fails."""


def publish_idle_guard(
    ecr=None, run: Runner = subprocess.run, which: Callable[[str], str | None] = shutil.which
) -> str:
    """`make up PROFILE=aws`'s step between its stacks: this checkout's guard image, for the nodes' platform, in its ECR
    repository (built and pushed only when its tag is not there yet), recorded for the platform stack's etcd issuer
    and idle guard; says what it did in one line. Without a builder (or a git checkout) the line says what to
    do; a failed build or push raises GuardImageFailed: the platform stack keeps the guard image recorded before."""
    infra = outputs.load_outputs()
    kept = (
        f"the platform keeps running {infra.idle_guard_image}"
        if infra.idle_guard_image
        else "neither the etcd issuer nor the idle guard runs"
    )
    repository = infra.idle_guard_repository
    if not repository:
        why = f"the infra stack has no {outputs.IDLE_GUARD_REPOSITORY} ECR repository yet"
        return _guard_skipped(why, kept, "`make up PROFILE=aws` (both stacks) makes it and starts the guard")
    try:
        tag = images.content_tag(images.checkout(), f"{images.GUARD}-{images.architecture(images.GUARD)}", run)
    except SpecError:
        return _guard_skipped("this is not a git checkout of trainkit", kept, "run `make up PROFILE=aws` from one")
    if ecr is None:
        import boto3

        ecr = boto3.client("ecr", region_name=infra.region)
    try:
        digest = images.digest_of(ecr, repository.split("/", 1)[1], tag)
    except (BotoCoreError, ClientError) as error:  # the platform stack goes on all the same, as after a failed build
        said = f"ECR did not say whether the idle guard's image {tag} is there ({error}), so {kept}"
        raise GuardImageFailed(said) from None
    if digest:
        entry = {"image": f"{repository}:{tag}", "tag": tag, "digest": digest}
        images.record(outputs.IDLE_GUARD_IMAGE_FILE, None, entry)
        return f"idle guard image {entry['image']}: already in ECR, not built again"
    try:
        tool = images.find_builder(run, which)
    except SpecError:
        fix = f"install Docker with buildx (its daemon running) or buildah, then run `{PLATFORM_RETRY}`"
        return _guard_skipped("no image builder here", kept, fix)
    plan = images.plan_build(images.GUARD, tag, tool=tool)
    print("\n".join(plan.describe()), flush=True)
    try:
        images.build(plan, run=run)
        pushed = images.push(tag, tool, ecr, run, flavor=images.GUARD)
    except SpecError as error:
        raise GuardImageFailed(f"the idle guard's image {tag} was not built and pushed ({error}), so {kept}") from None
    return f"idle guard image {pushed['image']} ({pushed['digest']}): {pushed['note']}"


def _guard_skipped(why: str, kept: str, fix: str) -> str:
    return f"note: the idle guard's image was not built ({why}), so {kept}: {fix}"
