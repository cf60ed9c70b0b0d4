"""ECR's image blobs for the image preflight (trainkit/backends/eks/image.py), which moto 5 leaves out: its
GetDownloadUrlForLayer raises NotImplementedError. `EcrBlobs` answers that operation inside moto and serves the
blobs over HTTP, the pre-signed S3 URL's part.

Rules, from the ECR API reference of GetDownloadUrlForLayer and botocore's ecr 2015-09-21 service model:
- request repositoryName, layerDigest (registryId optional); answer {downloadUrl, layerDigest};
- a repository that does not exist: RepositoryNotFoundException;
- "You can only get URLs for image layers that are referenced in an image": a digest that no image of the
  repository references (its manifest's config or layers) is LayersNotFoundException;
- the URL serves the blob's bytes (S3: GET with the signature in the query string, no other credentials).

`push(ecr, repository, tag, labels)` stands for a registry push: the image config blob (OCI image spec, config.md)
with those labels, and PutImage of an OCI manifest that names it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from moto.core.exceptions import ServiceException
from moto.core.responses import ActionResult
from moto.ecr.responses import ECRResponse


class LayersNotFoundException(ServiceException):
    code = "LayersNotFoundException"


def referenced(manifest: dict) -> set[str]:
    """The blobs a manifest names: its config and layers."""
    return {d["digest"] for d in [manifest.get("config", {}), *manifest.get("layers", [])] if "digest" in d}


class EcrBlobs:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        blobs = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                digest = self.path.split("?")[0].strip("/")
                path = blobs.folder / digest.replace(":", "-")
                if "X-Amz-Signature=" not in self.path or not path.is_file():
                    self.send_response(403)
                    self.end_headers()
                    return
                body = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def __enter__(self) -> EcrBlobs:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{self.server.server_address[1]}"

        def get_download_url_for_layer(response: ECRResponse) -> ActionResult:
            name, digest = response._get_param("repositoryName"), response._get_param("layerDigest")
            repository = response.ecr_backend._get_repository(name, response._get_param("registryId"))
            if not any(digest in referenced(json.loads(image.image_manifest)) for image in repository.images):
                raise LayersNotFoundException(f"The layer {digest} is not referenced by an image in {name}")
            return ActionResult({"downloadUrl": f"{base}/{digest}?X-Amz-Signature=stand-in", "layerDigest": digest})

        self.original = ECRResponse.get_download_url_for_layer
        ECRResponse.get_download_url_for_layer = get_download_url_for_layer
        return self

    def __exit__(self, *exc) -> None:
        ECRResponse.get_download_url_for_layer = self.original
        self.server.shutdown()
        self.server.server_close()

    def blob(self, body: bytes) -> dict:
        """Store a blob; its descriptor."""
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        (self.folder / digest.replace(":", "-")).write_bytes(body)
        return {"digest": digest, "size": len(body)}

    def push(self, ecr, repository: str, tag: str, labels: dict[str, str], architecture: str = "amd64") -> str:
        """A linux image of `architecture` whose config carries `labels`, under `tag`; its manifest digest."""
        config = {"architecture": architecture, "os": "linux", "config": {"Labels": labels}}
        config["rootfs"] = {"type": "layers"}
        layer = self.blob(tag.encode())  # one distinct layer per tag
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                **self.blob(json.dumps(config).encode()),
            },
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
        }
        image = ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=tag)
        return image["image"]["imageId"]["imageDigest"]
