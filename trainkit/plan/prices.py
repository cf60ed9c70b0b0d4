"""What an hour of a job costs on AWS, and where each price comes from (issue 55).

With AWS credentials the prices are today's, from the AWS Price List Query API (boto3's `pricing` client,
GetProducts: each PriceList entry a JSON string holding the product's attributes and its terms, OnDemand ->
priceDimensions -> pricePerUnit.USD), for the plan's region and target:

- EC2 on-demand Linux for the instance type (EKS node groups, Batch compute environments);
- SageMaker's training price for `--target sagemaker` (ml.<type>, priced apart from EC2);
- the standing costs a job runs on: the EKS control plane, the NAT gateway, FSx for Lustre.

They are cached under the state folder (`prices/<region>.json`) with the day they were asked, for that day. Without
credentials, or when the API does not answer, the shipped table (trainkit/tables/prices.json, dated) stands in, and
each line says which it is: "price list API, 2026-11-29" or "table of 2026-11-29".

A Capacity Block for ML (EKS and Batch) is priced by its offering: DescribeCapacityBlockOfferings gives the upfront
fee of a block of N instances for H hours, from which the effective hourly rate follows.

Filters, as AWS's price list names the attributes (and as infracost's AWS resources query them:
internal/resources/aws/instance.go, eks_cluster.go, nat_gateway.go): EC2 instanceType, operatingSystem Linux,
tenancy Shared, preInstalledSw NA, licenseModel "No License required", capacitystatus Used; the EKS cluster hour
usagetype `*AmazonEKS-Hours:perCluster`; the NAT gateway productFamily "NAT Gateway", usagetype `*NatGateway-Hours`;
SageMaker component Training and instanceName ml.<type>; FSx for Lustre fileSystemType Lustre, storageType SSD and
throughputCapacity the tier, per GB-Mo. Whether AWS's live list still names them so only AWS shows: an answer with
not exactly one price falls back to the table, and the plan's note says so (docs/cost.md).
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from trainkit.paths import make_folder, state_dir

TABLE = ("tables", "prices.json")
PRICING_REGION = "us-east-1"
"""The Price List Query API's endpoint region (it answers for every region from us-east-1, eu-central-1 and
ap-south-1: AWS Billing User Guide, "Using the AWS Price List Query API")."""
HOURS_PER_MONTH = 730
"""How AWS turns a monthly price into an hourly one on its pricing pages (730 hours a month)."""
OFFLINE_ENV = "TRAINKIT_PRICES"
"""`table`: never ask the API (a machine without network access to AWS)."""
BLOCK_MAX_INSTANCES, BLOCK_DAYS, BLOCK_WEEKS_MAX_DAYS = 64, 14, 182
"""Capacity Block sizes, as botocore's EC2 model (1.44) documents DescribeCapacityBlockOfferings: InstanceCount "up
to 64 instances" a block; CapacityDurationHours "in 1-day increments up 14 days, and in 7-day increments up to 182
days"."""
BLOCK_SEARCH_DAYS = 56
"""How far ahead a block may start (the plan looks 8 weeks out; EndDateRange is the block's latest end)."""


@dataclass(frozen=True)
class Price:
    usd: float
    unit: str  # "hour" or "GB-month"
    source: str  # "price list API, 2026-11-29" or "table of 2026-11-29"

    def __str__(self) -> str:
        return f"${self.usd:,.{3 if self.usd < 1 else 2}f}/{self.unit} ({self.source})"


@dataclass(frozen=True)
class Standing:
    """A cost the job's stack has while the job runs, whatever its size."""

    what: str
    usd_per_hour: float
    source: str


@dataclass(frozen=True)
class CapacityBlock:
    instance_type: str
    count: int
    hours: int
    upfront_usd: float
    start: str
    zone: str
    source: str

    @property
    def per_instance_hour(self) -> float:
        return self.upfront_usd / (self.hours * self.count)


@functools.cache
def table() -> dict:
    return json.loads(files("trainkit").joinpath(*TABLE).read_text())


def block_size(count: int, hours: float) -> tuple[int, int] | None:
    """The smallest Capacity Block that holds `count` instances for `hours`: (instances, hours); None: none does."""
    days = max(1, math.ceil(hours / 24))
    if days > BLOCK_DAYS:
        days = math.ceil(days / 7) * 7
    if count > BLOCK_MAX_INSTANCES or days > BLOCK_WEEKS_MAX_DAYS:
        return None
    return count, days * 24


def on_demand_usd(price_list: list[str], unit: str, accept=lambda attributes: True) -> set[float]:
    """The distinct non-zero on-demand prices per `unit` ("Hrs", "GB-Mo") in a GetProducts PriceList, of the
    products whose attributes `accept` takes."""
    found = set()
    for entry in price_list:
        item = json.loads(entry)
        if not accept(item.get("product", {}).get("attributes", {})):
            continue
        for term in item.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", 0))
                if dimension.get("unit") == unit and usd > 0:
                    found.add(usd)
    return found


def _match(field_name: str, value: str, kind: str = "TERM_MATCH") -> dict:
    return {"Type": kind, "Field": field_name, "Value": value}


EKS_HOURS, NAT_HOURS = "AmazonEKS-Hours:perCluster", "NatGateway-Hours"
"""Usage types, after their region's prefix (USE1-...): a CONTAINS filter finds them, and only a usage type that ends
so is the one priced (not extended support's, nor another NAT gateway hour such as a regional one)."""
EKS_FILTERS = [_match("usagetype", EKS_HOURS, "CONTAINS")]
NAT_FILTERS = [_match("productFamily", "NAT Gateway"), _match("usagetype", NAT_HOURS, "CONTAINS")]


def usage_ends(suffix: str):
    return lambda attributes: str(attributes.get("usagetype", "")).endswith(suffix)


@dataclass
class PriceBook:
    """Prices in `region`: the API's (cached for the day) when credentials exist, else the table's. `clients` is a
    callable service -> boto3 client (the tests hand in their own); `notes` collects why the API was not used."""

    region: str
    clients: object = None
    today: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).date().isoformat())
    notes: list[str] = field(default_factory=list)
    unreachable: bool = False
    """The API did not answer once: no other call waits for it (each would pay the timeouts again)."""

    # ------------------------------------------------------------------ what is priced

    def instance_hour(self, target: str, instance_type: str) -> Price | None:
        """An instance-hour of `instance_type` on `target`: SageMaker's training price for sagemaker, EC2 on-demand
        Linux otherwise. None: neither the API nor the table knows it."""
        if target == "sagemaker":
            name = f"ml.{instance_type}"
            filters = [_match("component", "Training"), _match("instanceName", name)]
            usd = self._api(f"sagemaker:{name}", "AmazonSageMaker", filters, "Hrs")
            return self._priced(usd, "hour", "sagemaker_training_hour", name)
        filters = [_match("instanceType", instance_type)]
        for name, value in (
            ("operatingSystem", "Linux"),
            ("tenancy", "Shared"),
            ("preInstalledSw", "NA"),
            ("licenseModel", "No License required"),
            ("capacitystatus", "Used"),
            ("marketoption", "OnDemand"),  # not a Capacity Block's or a reservation's product of the same type
        ):
            filters.append(_match(name, value))
        usd = self._api(f"ec2:{instance_type}", "AmazonEC2", filters, "Hrs")
        return self._priced(usd, "hour", "ec2_hour", instance_type)

    def standing(self, fsx_gib: int | None, fsx_per_tib: int | None) -> list[Standing]:
        """What the infra stack costs per hour while it is up, whatever runs: its EKS control plane, its NAT gateway
        and its FSx for Lustre file system (`fsx_gib` None: the stack has none)."""
        eks = self._api("eks:cluster", "AmazonEKS", EKS_FILTERS, "Hrs", usage_ends(EKS_HOURS))
        nat = self._api("nat:hour", "AmazonEC2", NAT_FILTERS, "Hrs", usage_ends(NAT_HOURS))
        eks, nat = self._priced(eks, "hour", "eks_cluster_hour"), self._priced(nat, "hour", "nat_gateway_hour")
        lines = [
            Standing("EKS control plane (1 cluster)", eks.usd, eks.source),
            Standing("NAT gateway (1; data processed comes on top)", nat.usd, nat.source),
        ]
        per_gb = self.fsx_gb_month(fsx_per_tib) if fsx_gib else None
        if per_gb is not None:
            what = f"FSx for Lustre ({fsx_gib:,} GiB Persistent-2 at {fsx_per_tib} MB/s/TiB, ${per_gb.usd}/GB-month)"
            lines.append(Standing(what, fsx_gib * per_gb.usd / HOURS_PER_MONTH, per_gb.source))
        return lines

    def fsx_gb_month(self, per_tib: int) -> Price | None:
        """A GB-month of FSx for Lustre Persistent-2 SSD at `per_tib` MB/s/TiB. Its tiers (125, 250, 500, 1000) are
        throughputCapacity values no other Lustre deployment type has (Persistent-1: 50, 100, 200)."""
        filters = [_match("fileSystemType", "Lustre"), _match("storageType", "SSD")]
        filters.append(_match("throughputCapacity", str(per_tib)))
        usd = self._api(f"fsx:lustre-ssd-{per_tib}", "AmazonFSx", filters, "GB-Mo")
        return self._priced(usd, "GB-month", "fsx_lustre_persistent_2_gb_month", str(per_tib))

    def capacity_block(self, instance_type: str, count: int, hours: float) -> CapacityBlock | str:
        """The cheapest Capacity Block offering that holds `count` instances for `hours` in the region, or why there
        is none to show."""
        size = block_size(count, hours)
        if size is None:
            return f"no Capacity Block holds {count} instances for {hours:.0f} h (at most 64 for 182 days)"
        if not self._online():
            return "Capacity Block offerings need AWS credentials (DescribeCapacityBlockOfferings)"
        instances, block_hours = size
        start = datetime.datetime.now(datetime.UTC)
        latest_end = start + datetime.timedelta(days=BLOCK_SEARCH_DAYS, hours=block_hours)
        try:
            found = _all_pages(
                self._client("ec2").describe_capacity_block_offerings,
                "CapacityBlockOfferings",
                InstanceType=instance_type,
                InstanceCount=instances,
                CapacityDurationHours=block_hours,
                StartDateRange=start,
                EndDateRange=latest_end,
                MaxResults=100,
            )
        except Exception as error:  # noqa: BLE001 - any failure of the call is said, and the plan goes on
            return f"Capacity Block offerings: {_said(error)}"
        offers = [o for o in found if o.get("CurrencyCode", "USD") == "USD"]
        if not offers:
            return f"no Capacity Block offering for {instances} x {instance_type} for {block_hours} h in {self.region}"
        best = min(offers, key=lambda o: float(o["UpfrontFee"]))
        start_date = best["StartDate"]
        shown = start_date.date().isoformat() if hasattr(start_date, "date") else str(start_date)[:10]
        source = f"DescribeCapacityBlockOfferings, {self.today}"
        fee = float(best["UpfrontFee"])
        return CapacityBlock(instance_type, instances, block_hours, fee, shown, best["AvailabilityZone"], source)

    # ------------------------------------------------------------------ where prices come from

    def _table_source(self) -> str:
        region = table()["region"]
        note = "" if region == self.region else f", {region}'s: {self.region}'s may differ"
        return f"table of {table()['as_of']}{note}"

    def _priced(self, usd: float | None, unit: str, key: str, name: str | None = None) -> Price | None:
        if usd is not None:
            return Price(usd, unit, f"price list API, {self.today}")
        row = table()[key]
        value = row.get(name) if name is not None else row
        return None if value is None else Price(float(value), unit, self._table_source())

    def _online(self) -> bool:
        if os.environ.get(OFFLINE_ENV) == "table" or self.unreachable:
            return False
        if self.clients is not None:
            return True
        try:
            import boto3

            return boto3.session.Session().get_credentials() is not None
        except Exception:  # noqa: BLE001 - a broken config file means no credentials to use
            return False

    def _client(self, service: str):
        if self.clients is not None:
            return self.clients(service)
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=5, read_timeout=10, retries={"mode": "standard", "total_max_attempts": 2})
        region = PRICING_REGION if service == "pricing" else self.region
        return boto3.client(service, region_name=region, config=config)

    def _cache(self) -> Path:
        return state_dir() / "prices" / f"{self.region}.json"

    def _api(self, key: str, service: str, filters: list[dict], unit: str, accept=None) -> float | None:
        """One price in the region from GetProducts (the day's cache first); None: offline, or the API did not give
        exactly one."""
        if not self._online():
            return None
        filters = [_match("regionCode", self.region), *filters]
        cache = self._cache()
        try:
            held = json.loads(cache.read_text())
        except (OSError, ValueError):
            held = {}
        if held.get("date") != self.today:
            held = {"date": self.today, "prices": {}}
        if key in held["prices"]:
            return held["prices"][key]
        try:
            pricing = self._client("pricing")
            price_list = _all_pages(
                pricing.get_products,
                "PriceList",
                ServiceCode=service,
                Filters=filters,
                FormatVersion="aws_v1",
                MaxResults=100,
            )
        except Exception as error:  # noqa: BLE001 - any failure: the table stands in, and the plan says why
            self._note(f"price list API: {_said(error)}")
            self.unreachable = not hasattr(error, "response")  # no answer at all, not a refusal of this one request
            return None
        found = on_demand_usd(price_list, unit, accept or (lambda attributes: True))
        if len(found) != 1:
            self._note(f"price list API: {len(found)} prices for {key} in {self.region}, not one")
            return None
        (usd,) = found
        held["prices"][key] = usd
        try:
            make_folder(cache.parent)
            cache.write_text(json.dumps(held, indent=2, sort_keys=True) + "\n")
        except OSError:
            pass  # an unwritable state folder costs a call next time, nothing else
        return usd

    def _note(self, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)


def _all_pages(call, items: str, **params) -> list:
    """Every item of a paginated call (a few pages at most: the requests leave one product, or a handful)."""
    found, token = [], None
    for _ in range(5):
        answer = call(**params, **({"NextToken": token} if token else {}))
        found += answer.get(items, [])
        token = answer.get("NextToken")
        if not token:
            break
    return found


def _said(error: Exception) -> str:
    code = getattr(error, "response", {}).get("Error", {}).get("Code")
    return f"{code or type(error).__name__}: {str(error)[:160]}"


def plan_region(recorded: str | None) -> str:
    """The region prices are for: the infra stack's, else the environment's, else the table's."""
    return recorded or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or table()["region"]
