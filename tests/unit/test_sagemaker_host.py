"""The SageMaker host entry point's reading of SageMaker's container contract (trainkit/backends/sagemaker/host.py):
its place in the job from resourceconfig.json, the failure file SageMaker shows, and the model from the first host
only."""

from __future__ import annotations

import pytest

from trainkit.backends.sagemaker import host


def test_each_host_finds_its_index_and_the_first_hosts_rendezvous():
    config = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-10"], "network_interface_name": "eth0"}
    assert host.placement(config) == ("algo-2", 1, "algo-1:29400")
    assert host.placement({**config, "current_host": "algo-10"})[1] == 2  # the given order, not a sort


def test_a_host_outside_the_list_is_refused():
    with pytest.raises(ValueError, match="current_host 'algo-3' is not among hosts"):
        host.placement({"current_host": "algo-3", "hosts": ["algo-1", "algo-2"]})


def test_the_failure_file_holds_the_cause_cut_to_what_sagemaker_shows(tmp_path, monkeypatch):
    monkeypatch.setenv(host.ROOT_ENV, str(tmp_path))
    host.report_failure("algo-1: rank 0: no space left on device " + "x" * 2000)
    written = (tmp_path / "output" / "failure").read_text()
    assert written.startswith("algo-1: rank 0: no space left") and len(written) == host.FAILURE_LIMIT


def test_the_host_that_holds_the_export_publishes_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv(host.ROOT_ENV, str(tmp_path / "ml"))
    run = tmp_path / "run"
    run.mkdir()
    host.publish_model(run)  # a host whose ranks did not export (rank 0 ran elsewhere)
    assert not (tmp_path / "ml" / "model").exists()
    (run / "model").mkdir()
    (run / "model" / "config.json").write_text("{}")
    host.publish_model(run)
    assert (tmp_path / "ml" / "model" / "config.json").read_text() == "{}"


def test_no_secret_named_means_no_token_and_no_call():
    assert host.hf_token(None) == {}
