"""SageMaker's checkpoint sync for one host of the stand-in (tests/helpers/sagemaker_standin.py): its
`CheckpointConfig.LocalPath` and the job's checkpoint prefix, by the rules the Developer Guide states ("Checkpoints in
Amazon SageMaker AI", formerly "Use checkpoints in Amazon SageMaker"):

- at the start the prefix is copied in: "Existing checkpoints in S3 are written to the SageMaker AI container at the
  start of the job" (the stand-in's `Job._download`; this class is made after it, and takes what it finds as in S3);
- nothing comes in later: "Checkpoints added to the S3 folder after the job has started are not copied to the
  training container";
- what the host writes goes up while it runs: "SageMaker AI also writes new checkpoints from the container to S3
  during training", and "Managed Spot Training": "SageMaker copies checkpoint data from a local path to Amazon S3";
- a deletion goes up too: "If a checkpoint is deleted in the SageMaker AI container, it will also be deleted in the
  S3 folder". Every host syncs the same prefix under the same keys ("Considerations": one S3 location "without
  additional suffixes or prefixes to tag checkpoints from multiple instances"), so a host that deletes a file the
  start copied in deletes it in S3 for every host, whoever wrote it.

This stand-in's reading of what no page says: a pass every SYNC_S (sagemaker_standin.py) uploads each new or changed
file (its inode, mtime or size differs from what was uploaded), oldest first, and deletes the key of each file gone
since, that this host had uploaded or found at the start. A file or folder renamed is its files gone under the old
names (deleted in S3) and new under the new ones (uploaded), as a watcher of the folder that knows no renames sees it;
whether SageMaker's agent does the same is not documented, so trainkit publishes without renames there
(training/common/checkpoint.py). Objects in S3 are written whole, so a file still being written goes up as far as it
got and again once it changed. AWS's own XGBoost container (sagemaker-xgboost-container, checkpointing.py) reads
marker files `<name>.sagemaker-uploading` and `<name>.sagemaker-uploaded` that the agent leaves beside a file; not
documented for the sync itself, and not made here.
"""

from __future__ import annotations

from pathlib import Path


def signatures(folder: Path) -> dict[str, tuple[int, int, int]]:
    """{path relative to `folder`: (inode, mtime ns, size)} of every file under it."""
    found = {}
    for path in folder.rglob("*"):
        try:
            stat = path.stat()
        except OSError:  # gone while we looked: the next pass sees what took its place
            continue
        if path.is_file():
            found[str(path.relative_to(folder))] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return found


class CheckpointSync:
    """One host's checkpoint folder and the job's checkpoint prefix (see the module's docstring)."""

    def __init__(self, s3, uri: str, local: Path):
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        self.s3, self.bucket, self.prefix, self.local = s3, bucket, key.rstrip("/"), local
        self.in_s3 = signatures(local)
        """What this host has in S3, as it was here when it went up (or was copied in at the start)."""

    def key(self, relative: str) -> str:
        """The key of a file here: the prefix and its path, joined by one `/` (a file the start copied in from a key
        that only begins with the prefix, `exp10/...` under `exp1`, maps to another key: not modelled)."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def push(self) -> None:
        """One pass: new and changed files up, in the order they were written; deleted files' keys removed."""
        here = signatures(self.local)
        for relative, signature in sorted(here.items(), key=lambda item: (item[1][1], item[0])):
            if self.in_s3.get(relative) == signature:
                continue
            try:
                data = (self.local / relative).read_bytes()
            except OSError:  # removed or renamed since the listing: the next pass sees it
                continue
            self.s3.put_object(Bucket=self.bucket, Key=self.key(relative), Body=data)
            self.in_s3[relative] = signature
        for relative in sorted(self.in_s3.keys() - here.keys()):
            self.s3.delete_object(Bucket=self.bucket, Key=self.key(relative))
            del self.in_s3[relative]
