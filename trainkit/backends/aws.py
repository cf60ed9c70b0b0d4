"""boto3 clients for the cloud backends (SageMaker, Batch): one per service and region, made on first use so that a
dry run, which contacts nothing, never imports boto3; the tests hand in their own."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Clients:
    """boto3 clients for one region, made on first use (tests hand in their own)."""

    region: str | None = None
    made: dict = field(default_factory=dict)

    def __call__(self, service: str):
        if service not in self.made:
            import boto3

            self.made[service] = boto3.client(service, region_name=self.region)
        return self.made[service]


def error_code(error: Exception) -> str | None:
    """The AWS error code of a botocore ClientError (None for anything else)."""
    return getattr(error, "response", {}).get("Error", {}).get("Code")
