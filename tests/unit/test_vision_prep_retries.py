"""ImageNet preparation's retries, in-process: transient failures are retried, request errors are not."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from training.vision.prep import PrepError, with_retries


def test_transient_failures_are_retried_and_request_errors_are_not():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("connection reset by peer")

    with_retries(flaky, "s3://b/k", base_delay=0)
    assert len(calls) == 3

    denied = []

    def forbidden():
        denied.append(1)
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")

    with pytest.raises(PrepError, match="s3://b/k: ClientError"):
        with_retries(forbidden, "s3://b/k", base_delay=0)
    assert len(denied) == 1

    def always_down():
        raise TimeoutError("read timed out")

    with pytest.raises(PrepError, match="TimeoutError: read timed out"):
        with_retries(always_down, "s3://b/k", attempts=3, base_delay=0)
