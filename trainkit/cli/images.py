"""`invoke images.*`: the training image (containers/train/Dockerfile), built and pushed to the stack's ECR; the
same for the idle guard's image (`--target guard`), which `make up PROFILE=aws` also does by itself."""

from __future__ import annotations

from invoke import Collection

from trainkit.cli.options import task, user_errors


@task(
    help={
        "target": "gpu (CUDA + EFA, for the cluster; default), cpu (Debian + Python: the same application stage), or "
        "guard (the EKS idle guard's small image, no torch; `make up PROFILE=aws` builds it when the guard is on).",
        "tag": "Image tag (default: content-addressed, <target>-<arch>-<commit>[-dirty-<hash>]; gpu and guard are "
        "built for the EKS nodes, linux/amd64, whatever machine builds them).",
        "base": "Base image instead of the Dockerfile's (CUDA_BASE for gpu, CPU_BASE for cpu and guard).",
        "ca-bundle": "CA bundle for pip behind a TLS-inspecting proxy; passed as a build secret, kept in no layer.",
        "torch-index": "Package index that serves torch (cpu default: PyTorch's CPU index; gpu: PyPI).",
        "wheels": "Folder of local wheels the build may use (e.g. a CPU torch wheel where no index serves one).",
        "layer-cache": "Keep and reuse each step's layer (default). --no-layer-cache builds every step afresh and "
        "keeps only the final image (buildah: one commit per stage, several times less disk; docker: --no-cache).",
        "dry-run": "Print the build (base, pins, tag, exact command) and build nothing.",
    }
)
@user_errors
def build(
    c, target="gpu", tag=None, base=None, ca_bundle=None, torch_index=None, wheels=None, layer_cache=True, dry_run=False
):
    """Build the training image (or the idle guard's) with docker buildx, or buildah where there is no Docker
    engine."""
    from trainkit.infra import images

    plan = images.plan_build(target, tag, base, ca_bundle, torch_index, layer_cache=layer_cache)
    print("\n".join(plan.describe()), flush=True)
    if not dry_run:
        print(f"built {images.build(plan, wheels)}")


@task(
    help={
        "target": "Which built image: gpu (default), cpu, or guard (to the infra stack's idle-guard repository).",
        "tag": "Tag to push (default: the last one `invoke images.build --target T` built).",
    }
)
@user_errors
def push(c, target="gpu", tag=None):
    """Push the image to the infra stack's ECR repository (login with the password on stdin) and record it as the
    default image of `invoke train --target eks` (the guard's: as the image of the platform stack's idle guard)."""
    from trainkit.infra import images

    pushed = images.push(tag or images.last_built(target), images.find_builder(), flavor=target)
    if target == images.GUARD:
        user = "the idle guard runs it from the next `invoke infra.up --profile aws --stack platform`"
    else:
        user = "`invoke train --target eks` now uses it"
    print(f"{pushed['image']} ({pushed['digest']}): {pushed['note']}; {user}")


collection = Collection("images", build, push)
