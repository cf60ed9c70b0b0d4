"""ImageNet preparation: copy a tree from S3 with boto3, then lay `val/` out in class folders.

    python -m training.vision.prep --source s3://bucket/imagenet/ --dest /fsx/imagenet

The same code runs in a pod on the FSx volume and locally (`invoke data.imagenet`). The copy is:
- parallel: a thread pool over one boto3 client (clients are thread-safe); large objects also use
  s3transfer's ranged, concurrent GETs;
- resumable: each file is downloaded to `.<name>.part` and renamed when complete; a manifest
  (`.trainkit-copy.jsonl`, key -> size and ETag) records finished files, so a re-run skips files that
  are present with the listed size and ETag and fetches only what is missing or changed;
- retried: botocore's standard retries plus our own backoff with jitter around each file;
- checked: at the end every listed object must be on disk with its listed size.
When the source holds `LOC_val_solution.csv` (or `--val-csv` names one), it is fetched first and
validation images go straight into `val/<wnid>/`; `relayout_val` then moves any flat leftovers.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from training.common.files import JsonlAppender, read_jsonl

from .layout import VAL_CSV_NAME, LayoutError, check_image_folder, file_delay, read_val_labels, relayout_val

MANIFEST = ".trainkit-copy.jsonl"
RETRIES = 5
LARGE_OBJECT = 64 * 1024**2
# Not worth retrying: the request itself is wrong (credentials, bucket, key).
FATAL_CODES = {"AccessDenied", "NoSuchBucket", "NoSuchKey", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "404"}


class PrepError(RuntimeError):
    """Data preparation cannot go on; the message says what to change or that a re-run resumes."""


@dataclass(frozen=True)
class S3Object:
    key: str
    relative: str
    size: int
    etag: str


@dataclass
class CopyReport:
    listed: int = 0
    copied: int = 0
    skipped: int = 0
    bytes_copied: int = 0
    failed: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"copy: {self.listed} objects listed, {self.copied} copied ({self.bytes_copied / 1e6:.1f} MB), "
            f"{self.skipped} already present"
        )


def parse_s3_url(url: str, flag: str = "--source") -> tuple[str, str]:
    if not url.startswith("s3://") or len(url) <= 5:
        raise PrepError(f"{flag} {url!r} must look like s3://bucket/prefix/")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix


def s3_client():
    """One client for all threads; the endpoint comes from the usual AWS settings (AWS_ENDPOINT_URL_S3 ...)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"max_attempts": 8, "mode": "standard"}, max_pool_connections=64))


def list_objects(client, bucket: str, prefix: str) -> list[S3Object]:
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if item["Key"].endswith("/"):
                continue  # "folder" placeholder objects
            found.append(S3Object(item["Key"], item["Key"][len(prefix) :], item["Size"], item["ETag"].strip('"')))
    return found


class Manifest:
    """Finished downloads, key -> (size, etag), in an append-only JSON-lines file (JsonlAppender, read_jsonl: a line
    a full volume or a kill cut short is dropped). The copy's threads append one at a time."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.done: dict[str, tuple[int, str]] = {e["key"]: (e["size"], e["etag"]) for e in read_jsonl(path)}
        path.parent.mkdir(parents=True, exist_ok=True)
        # Held open, unlocked: one copy writes a dataset folder at a time, and a million files each opening and
        # locking it would cost FSx's metadata server that many round trips.
        self._appender = JsonlAppender(path, locked=False)

    def matches(self, obj: S3Object) -> bool:
        return self.done.get(obj.key) == (obj.size, obj.etag)

    def record(self, obj: S3Object) -> None:
        with self._lock:
            self._appender.append({"key": obj.key, "size": obj.size, "etag": obj.etag})
            self.done[obj.key] = (obj.size, obj.etag)

    def close(self) -> None:
        self._appender.close()


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def already_present(obj: S3Object, target: Path, manifest: Manifest) -> bool:
    """Present with the listed size, and known to have the listed ETag (manifest, or MD5 for simple uploads)."""
    if not target.is_file() or target.stat().st_size != obj.size:
        return False
    if manifest.matches(obj):
        return True
    if "-" not in obj.etag and _md5(target) == obj.etag:  # a single-part upload's ETag is its MD5
        manifest.record(obj)
        return True
    return False


def _retryable(error: Exception) -> bool:
    from botocore.exceptions import ClientError

    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        return code not in FATAL_CODES
    return True  # connection resets, timeouts, truncated bodies


def with_retries(action: Callable[[], None], what: str, attempts: int = RETRIES, base_delay: float = 0.5) -> None:
    """Run `action`, retrying transient failures with exponential backoff and full jitter."""
    for attempt in range(1, attempts + 1):
        try:
            action()
            return
        except Exception as error:  # classified: transient failures are retried, request errors are not
            if not _retryable(error) or attempt == attempts:
                raise PrepError(f"{what}: {type(error).__name__}: {error}") from error
            time.sleep(random.uniform(0, base_delay * 2 ** (attempt - 1)))


def download(client, bucket: str, obj: S3Object, target: Path) -> None:
    from boto3.s3.transfer import TransferConfig

    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.part")
    config = TransferConfig(use_threads=obj.size >= LARGE_OBJECT, multipart_threshold=LARGE_OBJECT)

    def fetch() -> None:
        client.download_file(bucket, obj.key, str(part), Config=config)
        size = part.stat().st_size
        if size != obj.size:
            raise OSError(f"got {size} bytes of s3://{bucket}/{obj.key}, expected {obj.size}")

    with_retries(fetch, f"s3://{bucket}/{obj.key}")
    part.replace(target)


def copy_prefix(
    source: str,
    dest: str | Path,
    workers: int = 32,
    locate: Callable[[str], Path] | None = None,
    client=None,
    progress: bool = True,
) -> CopyReport:
    """Copy every object under `source` (s3://bucket/prefix/) to `dest`, skipping what is already there."""
    from tqdm import tqdm

    bucket, prefix = parse_s3_url(source)
    dest = Path(dest).expanduser()
    client = client or s3_client()
    objects = list_objects(client, bucket, prefix)
    if not objects:
        raise PrepError(f"nothing found under {source}; check --source (bucket, prefix) and your AWS credentials")
    locate = locate or (lambda relative: dest / relative)
    manifest = Manifest(dest / MANIFEST)
    report = CopyReport(listed=len(objects))
    todo = []
    for obj in objects:
        if already_present(obj, locate(obj.relative), manifest):
            report.skipped += 1
        else:
            todo.append(obj)
    delay = file_delay()
    bar = tqdm(total=sum(o.size for o in todo), unit="B", unit_scale=True, desc="copy", disable=not progress)
    bar.set_postfix(files=f"0/{len(todo)}")

    def one(obj: S3Object) -> S3Object:
        download(client, bucket, obj, locate(obj.relative))
        manifest.record(obj)
        if delay:
            time.sleep(delay)
        return obj

    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = [pool.submit(one, obj) for obj in todo]
            for future in as_completed(futures):
                try:
                    obj = future.result()
                except PrepError as error:
                    report.failed.append(str(error))
                    continue
                report.copied += 1
                report.bytes_copied += obj.size
                bar.update(obj.size)
                bar.set_postfix(files=f"{report.copied}/{len(todo)}")
    finally:
        bar.close()
        manifest.close()
    if report.failed:
        raise PrepError(
            f"{len(report.failed)} of {len(todo)} files failed after {RETRIES} attempts (first: {report.failed[0]}); "
            "re-run the same command to fetch only what is missing"
        )
    missing = [o.relative for o in objects if not _has_size(locate(o.relative), o.size)]
    if missing:
        raise PrepError(f"{len(missing)} listed files are missing after the copy (e.g. {missing[0]}); re-run")
    return report


def _has_size(path: Path, size: int) -> bool:
    return path.is_file() and path.stat().st_size == size


def _fetch_val_csv(val_csv: str | None, source: str, dest: Path, client) -> Path | None:
    """The label CSV on local disk: a given local path, a given s3:// URL, or the one at the source's root.
    Fetched like every other file: skipped when already present with the same size and ETag."""
    from botocore.exceptions import ClientError

    if val_csv and not val_csv.startswith("s3://"):
        return Path(val_csv).expanduser()
    if val_csv:
        bucket, key = parse_s3_url(val_csv, flag="--val-csv")
    else:
        bucket, prefix = parse_s3_url(source)
        key = f"{prefix.rstrip('/')}/{VAL_CSV_NAME}".lstrip("/")
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if not val_csv:
            return None  # no label CSV at the source: val/ must already be in class folders
        raise PrepError(f"--val-csv {val_csv}: {error}") from None
    obj = S3Object(key, VAL_CSV_NAME, head["ContentLength"], head["ETag"].strip('"'))
    target = dest / VAL_CSV_NAME
    manifest = Manifest(dest / MANIFEST)
    try:
        if not already_present(obj, target, manifest):
            download(client, bucket, obj, target)
            manifest.record(obj)
    finally:
        manifest.close()
    return target


def prepare_imagenet(
    dest: str | Path,
    source: str | None = None,
    val_csv: str | None = None,
    workers: int = 32,
    client=None,
    progress: bool = True,
) -> list[str]:
    """Copy (when `source` is given), re-lay out val/, check the tree; returns report lines."""
    dest = Path(dest).expanduser()
    lines = []
    csv_path = None
    if source:
        client = client or s3_client()
        dest.mkdir(parents=True, exist_ok=True)
        csv_path = _fetch_val_csv(val_csv, source, dest, client)
        labels = read_val_labels(csv_path) if csv_path else {}

        def locate(relative: str) -> Path:
            parts = relative.split("/")
            if len(parts) == 2 and parts[0] == "val" and Path(parts[1]).stem in labels:
                return dest / "val" / labels[Path(parts[1]).stem] / parts[1]
            return dest / relative

        lines.append(str(copy_prefix(source, dest, workers, locate, client, progress)))
    elif val_csv:
        csv_path = Path(val_csv).expanduser()
    if csv_path is None and (dest / VAL_CSV_NAME).is_file():
        csv_path = dest / VAL_CSV_NAME
    if csv_path is not None:
        lines.append(str(relayout_val(dest / "val", read_val_labels(csv_path))))
    classes = check_image_folder(dest, flag="--dest")
    lines.append(f"ready: {dest} ({len(classes)} classes) -> invoke train --model resnet50 --data {dest}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", required=True, help="Destination directory (the ImageFolder root).")
    parser.add_argument("--source", help="s3://bucket/prefix/ holding train/, val/ (and LOC_val_solution.csv).")
    parser.add_argument("--val-csv", help=f"{VAL_CSV_NAME}: local path or s3:// URL (default: at the source root).")
    parser.add_argument("--workers", type=int, default=32, help="Parallel downloads.")
    args = parser.parse_args(argv)
    try:
        for line in prepare_imagenet(args.dest, args.source, args.val_csv, args.workers):
            print(line, flush=True)
    except (PrepError, LayoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
