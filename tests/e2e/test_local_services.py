"""`make up` / `make down` on the local profile: a real etcd in the background for --rdzv etcd."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.helpers.product import invoke, only_run_dir
from trainkit.services import etcd_healthy


def test_up_starts_an_etcd_that_train_uses_and_down_stops_it(tmp_path):
    env = {"TRAINKIT_STATE_DIR": str(tmp_path / "state")}
    up = invoke("infra.up", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    endpoint = re.search(r"etcd +started on (\S+)", up.stdout).group(1)
    pid = int((tmp_path / "state" / "etcd" / "pid").read_text())
    assert etcd_healthy(endpoint)

    again = invoke("infra.up", env=env)  # idempotent: the same server
    assert f"etcd          running on {endpoint}" in again.stdout
    assert int((tmp_path / "state" / "etcd" / "pid").read_text()) == pid

    runs = tmp_path / "runs"
    flags = ["--rdzv", "etcd", "--nodes", "2", "--nproc", "1", "--steps", "2", "--metrics-port=0", "--runs-dir"]
    trained = invoke("train", *flags, str(runs), env=env)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    assert json.loads((only_run_dir(runs) / "spec.json").read_text())["elastic"]["rdzv_endpoint"] == endpoint

    down = invoke("infra.down", env=env)
    assert down.returncode == 0 and "stopped etcd" in down.stdout, down.stdout + down.stderr
    assert not etcd_healthy(endpoint)
    assert not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes()
    assert not (tmp_path / "state" / "etcd" / "data").exists()

    refused = invoke("train", *flags, str(tmp_path / "refused"), env=env)
    assert refused.returncode == 2 and "run `make up`" in refused.stderr, refused.stderr
    assert not (tmp_path / "refused").exists()
    assert "no local servers were running" in invoke("infra.down", env=env).stdout
