"""append_jsonl on a real full volume (a tmpfs this test mounts; CI runs as root): the write that the volume cuts
short is cut back, so a run's JSON-lines file ends with a whole line after "no space", where a plain append leaves
half of one (issue 45: that half line made every later start of the run fail)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from tests.helpers.volumes import small_volume
from training.common import files
from training.common.files import append_jsonl, read_jsonl


def jsonl_one_byte_short_of_a_page(path: Path, page: int) -> bytes:
    """Records, then blank lines, up to one byte short of the end of the file's second page: the volume, once full,
    has room for one more byte of it, so an append there is cut short after that byte."""
    size = 2 * page - 1
    lines = [json.dumps({"step": step, "loss": 1.0 / step}) + "\n" for step in range(1, 60)]
    text = "".join(lines)[: size // 2]
    text = text[: text.rindex("\n") + 1]
    data = (text + "\n" * (size - len(text))).encode()
    path.write_bytes(data)
    return data


def take_every_free_byte(volume: Path) -> Path:
    """Another file that takes all the space left: big writes until one fails, then ever smaller ones."""
    filler = volume / "other-writer"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        size = 1 << 20
        while size:
            try:
                os.write(descriptor, b"\0" * size)
            except OSError as error:
                assert error.errno == errno.ENOSPC
                size //= 2
    finally:
        os.close(descriptor)
    assert os.statvfs(volume).f_bavail == 0
    return filler


def test_an_append_the_full_volume_cuts_short_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    with small_volume(tmp_path / "volume", "1m") as volume:
        path = volume / "metrics.jsonl"
        before = jsonl_one_byte_short_of_a_page(path, os.statvfs(volume).f_bsize)
        records = read_jsonl(path)
        filler = take_every_free_byte(volume)
        record = {"step": 60, "loss": 0.0125, "time": 1700000000.0}

        real_write, wrote = os.write, []

        def write(descriptor: int, data: bytes) -> int:  # the real one, counted
            wrote.append(real_write(descriptor, data))
            return wrote[-1]

        monkeypatch.setattr(files.os, "write", write)
        with pytest.raises(OSError) as full:
            append_jsonl(path, record, durable=True)
        monkeypatch.undo()
        assert full.value.errno == errno.ENOSPC and wrote == [1]  # one byte went in, then "no space"
        assert path.read_bytes() == before  # the byte the volume took is given back

        with pytest.raises(OSError), path.open("a") as naive:  # what the run did before
            naive.write(json.dumps(record) + "\n")
        torn = path.read_bytes()
        assert len(torn) == len(before) + 1 and not torn.endswith(b"\n")  # this volume really tears lines
        assert read_jsonl(path) == records  # the reader drops it

        filler.unlink()  # space again: the next append cuts the torn byte off and adds its whole line
        append_jsonl(path, record, durable=True)
        assert path.read_bytes() == before + (json.dumps(record) + "\n").encode()
