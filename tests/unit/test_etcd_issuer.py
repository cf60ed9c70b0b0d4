"""The etcd issuer's decisions (trainkit/backends/eks/etcd_issuer.py): which jobs get an identity, which are refused
and why, which identities go, and for how long a certificate is valid. What etcd then does with them runs against
the real etcd in tests/integration/test_etcd_identities.py."""

from __future__ import annotations

import datetime

from trainkit.backends.eks.etcd_issuer import DEFAULT_VALIDITY, JobView, live_jobs, plan
from trainkit.backends.eks.etcd_tls import job_identity, job_keys


def job(name: str, uid: str, rdzv_id: str, created: str, **changes) -> dict:
    body = {
        "metadata": {
            "name": name,
            "uid": uid,
            "creationTimestamp": created,
            "labels": {"app.kubernetes.io/managed-by": "trainkit"},
        },
        "spec": {"elasticPolicy": {"rdzvBackend": "etcd", "rdzvId": rdzv_id}, "runPolicy": {}},
        "status": {"conditions": [{"type": "Running", "status": "True"}]},
    }
    for path, value in changes.items():
        target = body
        *parents, last = path.split("__")
        for part in parents:
            target = target[part]
        target[last] = value
    return body


def test_only_trainkits_live_etcd_jobs_count_and_a_deadline_bounds_the_certificate():
    items = [
        job("a", "u-a", "a-1", "2026-11-28T10:00:00Z"),
        job("deadline", "u-d", "d-1", "2026-11-28T10:00:00Z", spec__runPolicy={"activeDeadlineSeconds": 7200}),
        job("c10d", "u-c", "c-1", "2026-11-28T10:00:00Z", spec__elasticPolicy={"rdzvBackend": "c10d", "rdzvId": "c"}),
        job("theirs", "u-t", "t-1", "2026-11-28T10:00:00Z", metadata__labels={}),
        job(
            "done",
            "u-s",
            "s-1",
            "2026-11-28T10:00:00Z",
            status={"conditions": [{"type": "Succeeded", "status": "True"}]},
        ),
        job(
            "failed",
            "u-f",
            "f-1",
            "2026-11-28T10:00:00Z",
            status={"conditions": [{"type": "Failed", "status": "True"}]},
        ),
        job("going", "u-g", "g-1", "2026-11-28T10:00:00Z", metadata__deletionTimestamp="2026-11-28T11:00:00Z"),
    ]
    live = {view.name: view for view in live_jobs(items)}
    assert sorted(live) == ["a", "deadline"]
    assert live["a"].valid_for == DEFAULT_VALIDITY
    assert live["deadline"].valid_for == datetime.timedelta(hours=3)  # the deadline and an hour more


def test_an_id_belongs_to_the_earliest_job_and_identities_without_a_live_holder_go():
    day = datetime.timedelta(days=1)
    jobs = [
        JobView("late", "u-late", "shared-1", "2026-11-28T10:05:00Z", day),
        JobView("early", "u-early", "shared-1", "2026-11-28T10:00:00Z", day),
        JobView("slash", "u-slash", "a/b", "2026-11-28T10:00:00Z", day),  # would be a key prefix of others
        JobView("star", "u-star", "a*", "2026-11-28T10:00:00Z", day),
        JobView("own", "u-own", "own-1", "2026-11-28T10:00:00Z", day),
    ]
    known = {"root", job_identity("u-early"), job_identity("u-gone"), job_identity("u-late")}
    decided = plan(jobs, known)
    assert [j.name for j in decided.holders] == ["early", "own"]
    refused = {j.name: why for j, why in decided.refused}
    assert refused["late"] == "its rendezvous id shared-1 belongs to job early"
    assert "is not 1-128 of [A-Za-z0-9._-]" in refused["slash"] and "is not" in refused["star"]
    # root is not a job's; a job gone, and one that never held its id, lose theirs
    assert decided.revoke == sorted([job_identity("u-gone"), job_identity("u-late")])


def test_a_job_is_granted_its_state_key_exactly_and_its_store_folder():
    keys = job_keys("run-1-0a1b2c3d")
    assert keys == [
        "/torch/elastic/rendezvous/run-1-0a1b2c3d",  # exact: not run-1-0a1b2c3d-other
        "/torch/elastic/store/run-1-0a1b2c3d",  # the folder itself: EtcdStore lists it
        "/torch/elastic/store/run-1-0a1b2c3d/*",  # and what is inside, never a sibling folder
    ]
