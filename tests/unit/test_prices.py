"""Prices (issue 55): the Price List answer's parser on a real answer, the stand-in held to that answer's shape and to
botocore's models, Capacity Block sizes, the day's cache, and the table's defaults against the stack's."""

from __future__ import annotations

import json

import boto3
import botocore.exceptions
import hcl2
import pytest

from tests.helpers.paths import REPO
from tests.helpers.pricing_standin import PricingStandIn, catalogue
from trainkit.errors import SpecError
from trainkit.plan.cost import FSX_DEFAULTS
from trainkit.plan.price_table import refreshed_table
from trainkit.plan.prices import OFFLINE_ENV, PriceBook, block_size, on_demand_usd, table

pytestmark = pytest.mark.unit

SAMPLE = json.loads((REPO / "tests" / "data" / "pricing" / "aws-cli-get-products.json").read_text())["response"]


def shape(value):
    """The keys of every object in `value`, with the keys that name a SKU, offer or rate made generic."""
    if isinstance(value, dict):
        return {("<id>" if "." in key or key.isupper() else key): shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value[:1]]
    return type(value).__name__


def test_the_parser_reads_a_real_answer_and_the_stand_in_answers_in_its_shape():
    assert on_demand_usd(SAMPLE["PriceList"], "GB-Mo") == {0.138}  # "$0.138 per GB-month of Provisioned IOPS SSD"
    assert on_demand_usd(SAMPLE["PriceList"], "Hrs") == set()  # another unit is not this price
    real = json.loads(SAMPLE["PriceList"][0])
    for product in catalogue():
        ours = json.loads(json.dumps(product))
        assert shape(ours)["terms"] == shape(real)["terms"] and shape(ours).keys() == shape(real).keys()
        assert ours["product"].keys() == real["product"].keys()


def test_an_instance_price_is_asked_by_the_attribute_names_real_ec2_entries_carry(tmp_path, monkeypatch):
    """The EC2 request's fields, held to a real instance entry (tests/data/pricing/ec2-instance-entry.json), and the
    stand-in's EC2 products to the same names: a filter on a name the price list lacks would match nothing."""
    monkeypatch.delenv(OFFLINE_ENV)
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path))
    real = json.loads((REPO / "tests" / "data" / "pricing" / "ec2-instance-entry.json").read_text())["PriceList"]
    assert on_demand_usd(real, "Hrs") == {0.468}
    attributes = json.loads(real[0])["product"]["attributes"]
    asked = []

    class Pricing:
        def get_products(self, **request):
            asked.append(request)
            return {"PriceList": []}

    PriceBook("us-east-1", clients=lambda service: Pricing()).instance_hour("eks", "p5.48xlarge")
    (request,) = asked
    assert request["ServiceCode"] == "AmazonEC2" and {f["Field"] for f in request["Filters"]} <= attributes.keys()
    for product in catalogue():
        if product["product"]["productFamily"] == "Compute Instance":
            assert product["product"]["attributes"].keys() <= attributes.keys()


@pytest.mark.parametrize(
    ("count", "hours", "size"),
    [(16, 0.3, (16, 24)), (3, 400, (3, 21 * 24)), (1, 14 * 24, (1, 14 * 24)), (65, 1, None), (1, 183 * 24, None)],
)
def test_a_capacity_block_is_the_smallest_that_aws_offers_for_the_job(count, hours, size):
    assert block_size(count, hours) == size


def client_of(url: str):
    def clients(service: str):
        region = "us-east-1"
        return boto3.client(
            service, region_name=region, endpoint_url=url, aws_access_key_id="t", aws_secret_access_key="t"
        )

    return clients


def test_requests_botocore_or_the_service_refuses_fail_and_prices_are_cached_for_the_day(tmp_path, monkeypatch):
    monkeypatch.delenv(OFFLINE_ENV)
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path))
    with PricingStandIn() as aws:
        pricing, ec2 = client_of(aws.url)("pricing"), client_of(aws.url)("ec2")
        with pytest.raises(botocore.exceptions.ClientError, match="InvalidParameterException"):
            pricing.get_products(ServiceCode="AmazonEC2", Filters=[{"Type": "REGEX", "Field": "x", "Value": "x"}])
        with pytest.raises(botocore.exceptions.ClientError, match="holds up to 64 instances"):
            ec2.describe_capacity_block_offerings(
                InstanceType="p5.48xlarge", InstanceCount=65, CapacityDurationHours=48
            )
        with pytest.raises(botocore.exceptions.ClientError, match="7-day increments"):
            ec2.describe_capacity_block_offerings(
                InstanceType="p5.48xlarge", InstanceCount=1, CapacityDurationHours=15 * 24
            )
        book = PriceBook("us-east-1", clients=client_of(aws.url))
        assert str(book.instance_hour("batch", "p5.48xlarge")) == f"$51.23/hour (price list API, {book.today})"
        asked = len(aws.requests)
        again = PriceBook("us-east-1", clients=client_of(aws.url))
        assert again.instance_hour("eks", "p5.48xlarge").usd == 51.23 and len(aws.requests) == asked  # the cache
        tomorrow = PriceBook("us-east-1", clients=client_of(aws.url), today="2999-01-01")
        assert tomorrow.instance_hour("eks", "p5.48xlarge").source == "price list API, 2999-01-01"
        assert len(aws.requests) == asked + 1
        block = book.capacity_block("p5.48xlarge", 8, 30)  # 8 instances for 2 days: the cheaper of two offerings
        assert (block.count, block.hours, block.zone) == (8, 48, "us-east-1b")
        assert block.per_instance_hour == pytest.approx(31.464)
        long = book.capacity_block("p5.48xlarge", 16, 60 * 24)  # past 8 weeks: EndDateRange is the block's latest end
        assert (long.count, long.hours) == (16, 63 * 24), long
    unknown = PriceBook("eu-west-1", clients=client_of("http://127.0.0.1:9"))  # nothing answers: the table stands in
    assert (
        unknown.instance_hour("eks", "p5.48xlarge").source
        == f"table of {table()['as_of']}, us-east-1's: eu-west-1's may differ"
    )
    assert unknown.notes and unknown.notes[0].startswith("price list API: ")


def test_the_table_is_refreshed_only_from_the_api():
    with pytest.raises(SpecError, match="the price list API did not price p4d.24xlarge, p5.48xlarge, ml.p4d"):
        refreshed_table(PriceBook("us-east-1"))  # the unit layer never asks: every row is the table's


def test_the_fsx_defaults_are_the_stacks():
    variables = hcl2.loads((REPO / "terraform" / "stacks" / "infra" / "variables.tf").read_text())["variable"]
    defaults = {name.strip('"'): body.get("default") for entry in variables for name, body in entry.items()}
    assert FSX_DEFAULTS == (defaults["fsx_storage_capacity_gib"], defaults["fsx_throughput_per_tib"])
    assert str(FSX_DEFAULTS[1]) in table()["fsx_lustre_persistent_2_gb_month"]
