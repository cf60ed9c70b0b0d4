"""A stand-in for the two AWS APIs that price a plan (issue 55), which moto does not implement: the Price List Query
API's GetProducts (JSON 1.1, X-Amz-Target AWSPriceListService.GetProducts) and EC2's DescribeCapacityBlockOfferings
(EC2 query protocol: a form request, an XML answer), on 127.0.0.1. The launcher reaches it as it reaches AWS, through
boto3 with AWS_ENDPOINT_URL_PRICING and AWS_ENDPOINT_URL_EC2.

Built from botocore's service models: every request is checked against its operation's input shape
(tests/helpers/aws_model.py) and refused as the service refuses it (400, InvalidParameterException /
InvalidParameterValue), so a request the real front end rejects fails the test. The EC2 answer is written from the
output shape's member names (their locationName, lists as <item>), so botocore parses it as it parses EC2's.
GetProducts answers PriceList entries as JSON strings in the documented shape of a real answer
(tests/data/pricing/aws-cli-get-products.json: product{productFamily, attributes, sku}, serviceCode,
terms.OnDemand.<sku>.<offer>.priceDimensions.<rate>.pricePerUnit.USD, version, publicationDate); its filters match
as the API documents them (TERM_MATCH: the attribute equals the value; CONTAINS: holds it); its catalogue names
the attributes as trainkit/plan/prices.py cites them, beside products of other values the filters must leave
out. The service's own rules for Capacity Blocks are kept, as botocore's EC2 model (1.44) documents
DescribeCapacityBlockOfferings: up to 64 instances a block; 1-day increments up to 14 days, then 7-day increments up
to 182 days; an offering starts no earlier than StartDateRange and ends no later than EndDateRange.
"""

from __future__ import annotations

import datetime
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

import botocore.session

from tests.helpers.aws_model import problems
from trainkit.plan.prices import OFFLINE_ENV

OFFER = "JRTCKXETXF"  # the on-demand offer term code real answers carry
RATE = "6YS6EN2CT7"


def product(service: str, family: str, sku: str, usd: float, unit: str, **attributes: str) -> dict:
    """A price-list product in the shape of a real GetProducts entry, with one on-demand price."""
    rate = f"{sku}.{OFFER}.{RATE}"
    dimension = {
        "unit": unit,
        "endRange": "Inf",
        "description": f"${usd} per {unit}",
        "appliesTo": [],
        "rateCode": rate,
        "beginRange": "0",
        "pricePerUnit": {"USD": f"{usd:.10f}"},
    }
    term = {
        "priceDimensions": {rate: dimension},
        "sku": sku,
        "effectiveDate": "2025-06-01T00:00:00Z",
        "offerTermCode": OFFER,
        "termAttributes": {},
    }
    return {
        "product": {"productFamily": family, "attributes": {"servicecode": service, **attributes}, "sku": sku},
        "serviceCode": service,
        "terms": {"OnDemand": {f"{sku}.{OFFER}": term}},
        "version": "20251101000000",
        "publicationDate": "2025-11-01T00:00:00Z",
    }


def ec2_instance(sku: str, usd: float, instance_type: str, region: str, **changed: str) -> dict:
    attributes = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "licenseModel": "No License required",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
        "usagetype": f"BoxUsage:{instance_type}",
    }
    return product("AmazonEC2", "Compute Instance", sku, usd, "Hrs", **{**attributes, **changed})


def catalogue(region: str = "us-east-1") -> list[dict]:
    """p5.48xlarge in `region` as EC2 and SageMaker price it, and the standing parts; beside each, products the
    launcher's filters must leave out (another OS, tenancy, software, capacity status, region, component)."""
    return [
        ec2_instance("P5LINUX", 51.23, "p5.48xlarge", region),
        ec2_instance("P5WINDOWS", 99.01, "p5.48xlarge", region, operatingSystem="Windows"),
        ec2_instance("P5DEDICATED", 60.5, "p5.48xlarge", region, tenancy="Dedicated"),
        ec2_instance("P5SQL", 70.25, "p5.48xlarge", region, preInstalledSw="SQL Std"),
        ec2_instance("P5UNUSED", 12.5, "p5.48xlarge", region, capacitystatus="UnusedCapacityReservation"),
        ec2_instance("P5OTHER", 58.0, "p5.48xlarge", "eu-west-1"),
        ec2_instance("P5BLOCK", 31.46, "p5.48xlarge", region, marketoption="CapacityBlock"),
        ec2_instance("P4DLINUX", 20.11, "p4d.24xlarge", region),
        product(
            "AmazonSageMaker",
            "ML Instance",
            "MLP5TRAIN",
            59.87,
            "Hrs",
            regionCode=region,
            component="Training",
            instanceName="ml.p5.48xlarge",
        ),
        product(
            "AmazonSageMaker",
            "ML Instance",
            "MLP4DTRAIN",
            23.42,
            "Hrs",
            regionCode=region,
            component="Training",
            instanceName="ml.p4d.24xlarge",
        ),
        product(
            "AmazonSageMaker",
            "ML Instance",
            "MLP5HOST",
            66.1,
            "Hrs",
            regionCode=region,
            component="Hosting",
            instanceName="ml.p5.48xlarge",
        ),
        product(
            "AmazonEKS",
            "Compute",
            "EKSCLUSTER",
            0.1,
            "Hrs",
            regionCode=region,
            usagetype="USE1-AmazonEKS-Hours:perCluster",
        ),
        product(
            "AmazonEKS",
            "Compute",
            "EKSEXTENDED",
            0.6,
            "Hrs",
            regionCode=region,
            usagetype="USE1-AmazonEKS-Hours:extendedSupport",
        ),
        product(
            "AmazonEC2", "NAT Gateway", "NATHOURS", 0.048, "Hrs", regionCode=region, usagetype="USE1-NatGateway-Hours"
        ),
        product(  # another NAT gateway hour (grafana/cloudcost-exporter's tests model such usage types beside it)
            "AmazonEC2",
            "NAT Gateway",
            "NATMORE",
            0.01,
            "Hrs",
            regionCode=region,
            usagetype="USE1-NatGateway-Hours-Additional",
        ),
        *(
            product(
                "AmazonFSx",
                "Storage",
                f"FSXLUSTRE{tier}",
                usd,
                "GB-Mo",
                regionCode=region,
                fileSystemType="Lustre",
                storageType=kind,
                throughputCapacity=str(tier),
                usagetype=f"USE1-Storage.{kind}.{tier}",
            )
            for kind, tier, usd in (
                ("SSD", 125, 0.15),
                ("SSD", 250, 0.205),
                ("SSD", 500, 0.335),
                ("SSD", 1000, 0.59),
                ("SSD", 200, 0.29),  # Persistent-1's tier
                ("HDD", 12, 0.025),
            )
        ),
        product(
            "AmazonEC2", "NAT Gateway", "NATBYTES", 0.045, "GB", regionCode=region, usagetype="USE1-NatGateway-Bytes"
        ),
    ]


def matches(item: dict, flt: dict) -> bool:
    attributes = {**item["product"]["attributes"], "productFamily": item["product"]["productFamily"]}
    value = attributes.get(flt["Field"])
    if value is None:
        return False
    if flt["Type"] == "TERM_MATCH":
        return value == flt["Value"]
    if flt["Type"] == "CONTAINS":
        return flt["Value"] in value
    if flt["Type"] == "EQUALS":
        return value == flt["Value"]
    return False


def block_problem(count: int, hours: int) -> str | None:
    """The service's rule on a block's size (in the model's documentation, not its shapes)."""
    if not 1 <= count <= 64:
        return f"InstanceCount {count}: a Capacity Block holds up to 64 instances"
    days, rest = divmod(hours, 24)
    if rest or days < 1 or (days > 14 and (days % 7 or days > 182)):
        return f"CapacityDurationHours {hours}: 1-day increments up to 14 days, then 7-day increments up to 182"
    return None


class PricingStandIn:
    """GetProducts over `products`, and Capacity Block offerings of `block_rate` USD per instance-hour (two
    offerings, the second dearer) for the instance types in `blocks`. `requests` records every request as parsed."""

    def __init__(self, products: list[dict] | None = None, block_rate: float = 31.464, blocks=("p5.48xlarge",)):
        self.products = catalogue() if products is None else products
        self.block_rate, self.blocks = block_rate, set(blocks)
        self.requests: list[tuple[str, dict]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.ec2 = botocore.session.get_session().get_service_model("ec2")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def env(self) -> dict[str, str]:
        """What points boto3 at the stand-in, with credentials to sign with."""
        return {
            "AWS_ENDPOINT_URL_PRICING": self.url,
            "AWS_ENDPOINT_URL_EC2": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            OFFLINE_ENV: "api",  # the suite keeps the launcher on the table unless a test points it here
        }

    def __enter__(self) -> PricingStandIn:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ GetProducts

    def get_products(self, body: dict) -> tuple[int, dict]:
        self.requests.append(("GetProducts", body))
        refused = problems("pricing", "GetProducts", body)
        if refused:
            return 400, {"__type": "InvalidParameterException", "Message": "; ".join(refused)}
        found = [
            p
            for p in self.products
            if p["serviceCode"] == body["ServiceCode"] and all(matches(p, f) for f in body.get("Filters", []))
        ]
        start = int(body.get("NextToken") or 0)
        size = body.get("MaxResults", 100)
        page = found[start : start + size]
        answer = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p, separators=(",", ":")) for p in page]}
        if start + size < len(found):
            answer["NextToken"] = str(start + size)
        return 200, answer

    # ------------------------------------------------------------------ DescribeCapacityBlockOfferings

    def _params(self, form: dict[str, str]) -> tuple[dict, list[str]]:
        """The form as the operation's input (top-level members by their query names), and what is unknown."""
        shape = self.ec2.operation_model("DescribeCapacityBlockOfferings").input_shape
        names = {_query_name(name, m): name for name, m in shape.members.items()}
        params, unknown = {}, []
        for key, value in form.items():
            if key in ("Action", "Version"):
                continue
            name = names.get(key)
            if name is None:
                unknown.append(f"unknown parameter {key}")
                continue
            kind = shape.members[name].type_name
            if kind == "integer":
                params[name] = int(value)
            elif kind == "boolean":
                params[name] = value == "true"
            elif kind == "timestamp":
                params[name] = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            else:
                params[name] = value
        return params, unknown

    def offerings(self, form: dict[str, str]) -> tuple[int, str]:
        params, unknown = self._params(form)
        self.requests.append(("DescribeCapacityBlockOfferings", params))
        refused = unknown + problems("ec2", "DescribeCapacityBlockOfferings", params)
        if not refused:  # the model's rules first: a request without a duration never reaches the service's
            refused += [
                p for p in [block_problem(params.get("InstanceCount", 1), params["CapacityDurationHours"])] if p
            ]
        if refused:
            error = f"<Error><Code>InvalidParameterValue</Code><Message>{escape('; '.join(refused))}</Message></Error>"
            return 400, f"<Response><Errors>{error}</Errors><RequestID>standin</RequestID></Response>"
        items = []
        if params.get("InstanceType") in self.blocks:
            count, hours = params["InstanceCount"], params["CapacityDurationHours"]
            start = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=2)).replace(
                hour=11, minute=30, second=0, microsecond=0
            )  # blocks start at 11:30 UTC (EC2 User Guide, Capacity Blocks)
            earliest = params.get("StartDateRange", start)
            latest = params.get("EndDateRange", start + datetime.timedelta(days=365))
            for index, factor in enumerate((1.08, 1.0)):
                begins = start + datetime.timedelta(days=index)
                if begins < earliest or begins + datetime.timedelta(hours=hours) > latest:
                    continue  # outside the window the request gives
                offer = {
                    "CapacityBlockOfferingId": f"cbr-0standin{index}",
                    "InstanceType": params["InstanceType"],
                    "AvailabilityZone": f"us-east-1{'ab'[index]}",
                    "InstanceCount": count,
                    "StartDate": (start + datetime.timedelta(days=index)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                    "EndDate": (start + datetime.timedelta(days=index, hours=hours)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                    "CapacityBlockDurationHours": hours,
                    "UpfrontFee": f"{self.block_rate * factor * count * hours:.2f}",
                    "CurrencyCode": "USD",
                    "Tenancy": "default",
                }
                items.append(offer)
        output = self.ec2.operation_model("DescribeCapacityBlockOfferings").output_shape
        body = _xml(output, {"CapacityBlockOfferings": items})
        return 200, (
            '<DescribeCapacityBlockOfferingsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            f"<requestId>standin</requestId>{body}</DescribeCapacityBlockOfferingsResponse>"
        )

    # ------------------------------------------------------------------ HTTP

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                if target == "AWSPriceListService.GetProducts":
                    status, answer = standin.get_products(json.loads(raw or b"{}"))
                    self._send(status, json.dumps(answer).encode(), "application/x-amz-json-1.1")
                    return
                form = dict(urllib.parse.parse_qsl(raw.decode()))
                if form.get("Action") == "DescribeCapacityBlockOfferings":
                    status, text = standin.offerings(form)
                    self._send(status, text.encode(), "text/xml")
                    return
                self._send(400, b'{"__type": "UnknownOperationException"}', "application/x-amz-json-1.1")

            def _send(self, status: int, data: bytes, kind: str):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _query_name(name: str, member) -> str:
    """How the EC2 query protocol names a top-level member (botocore/serialize.py, EC2Serializer._get_serialized_name:
    queryName, else locationName capitalised, else the member's name)."""
    if "queryName" in member.serialization:
        return member.serialization["queryName"]
    located = member.serialization.get("name")
    return located[0].upper() + located[1:] if located else name


def _xml(shape, value) -> str:
    """`value` as EC2's query protocol writes the shape: each member under its locationName, list items as <item>."""
    if shape.type_name == "structure":
        parts = []
        for name, member in shape.members.items():
            if name in value and value[name] is not None:
                tag = member.serialization.get("name") or name
                parts.append(f"<{tag}>{_xml(member, value[name])}</{tag}>")
        return "".join(parts)
    if shape.type_name == "list":
        return "".join(f"<item>{_xml(shape.member, item)}</item>" for item in value)
    return escape(str(value))
