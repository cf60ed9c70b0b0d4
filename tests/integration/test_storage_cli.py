"""The local disk check through the real command line: a run that cannot fit is refused before anything
is written."""

from __future__ import annotations

from tests.helpers.product import invoke


def test_a_run_that_cannot_fit_on_the_local_disk_is_refused_before_anything_is_written(tmp_path):
    runs = tmp_path / "runs"
    # 51 checkpoints of a 70B model (~42 TB) fit on no disk this suite runs on.
    args = ["--model", "llama2-70b", "--init", "random", "--steps", "10000", "--checkpoint-interval", "1"]
    result = invoke("train", *args, "--keep-checkpoints", "50", "--runs-dir", str(runs), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "51 checkpoint(s) of 827.7 GB" in result.stderr and "GB free" in result.stderr, result.stderr
    assert "--keep-checkpoints, now 50" in result.stderr and "--runs-dir" in result.stderr
    assert not runs.exists() or not any(runs.iterdir())
