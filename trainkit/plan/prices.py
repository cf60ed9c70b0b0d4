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
BLOCK_COUNTS = (1, 2, 4, 8, 16, 32, 64)
BLOCK_DAYS, BLOCK_WEEKS_MAX_DAYS = 14, 182
"""Capacity Block sizes (EC2 API Reference, DescribeCapacityBlockOfferings): 1, 2, 4, 8, 16, 32 or 64 instances;
1-day increments up to 14 days, then 7-day increments up to 182 days."""


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
    instances = next((n for n in BLOCK_COUNTS if n >= count), None)
    days = max(1, math.ceil(hours / 24))
    if days > BLOCK_DAYS:
        days = math.ceil(days / 7) * 7
    if instances is None or days > BLOCK_WEEKS_MAX_DAYS:
        return None
    return instances, days * 24


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


@dataclass
class PriceBook:
    """Prices in `region`: the API's (cached for the day) when credentials exist, else the table's. `clients` is a
    callable service -> boto3 client (the tests hand in their own); `notes` collects why the API was not used."""

    region: str
    clients: object = None
    today: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).date().isoformat())
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ what is priced

    def instance_hour(self, target: str, instance_type: str) -> Price | None:
        """An instance-hour of `instance_type` on `target`: SageMaker's training price for sagemaker, EC2 on-demand
        Linux otherwise. None: neither the API nor the table knows it."""
        if target == "sagemaker":
            name = f"ml.{instance_type}"
            filters = [_match("regionCode", self.region), _match("component", "Training")]
            filters.append(_match("instanceName", name))
            usd = self._api(f"sagemaker:{name}", "AmazonSageMaker", filters, "Hrs")
            return self._priced(usd, "hour", "sagemaker_training_hour", name)
        filters = [_match("regionCode", self.region), _match("instanceType", instance_type)]
        for name, value in (
            ("operatingSystem", "Linux"),
            ("tenancy", "Shared"),
            ("preInstalledSw", "NA"),
            ("licenseModel", "No License required"),
            ("capacitystatus", "Used"),
        ):
            filters.append(_match(name, value))
        usd = self._api(f"ec2:{instance_type}", "AmazonEC2", filters, "Hrs")
        return self._priced(usd, "hour", "ec2_hour", instance_type)

    def standing(self, target: str, fsx_gib: int | None, fsx_per_tib: int | None) -> list[Standing]:
        """The stack's costs per hour while a job runs on `target`: the EKS control plane (eks), the NAT gateway
        (every target in the stack's VPC), FSx for Lustre (eks and batch, whose runs live on it)."""
        lines = []
        if target == "eks":
            filters = [_match("regionCode", self.region), _match("usagetype", "AmazonEKS-Hours:perCluster", "CONTAINS")]
            eks = self._priced(self._api("eks:cluster", "AmazonEKS", filters, "Hrs"), "hour", "eks_cluster_hour")
            lines.append(Standing("EKS control plane (1 cluster)", eks.usd, eks.source))
        filters = [_match("regionCode", self.region), _match("productFamily", "NAT Gateway")]
        filters.append(_match("usagetype", "NatGateway-Hours", "CONTAINS"))
        nat = self._priced(self._api("nat:hour", "AmazonEC2", filters, "Hrs"), "hour", "nat_gateway_hour")
        lines.append(Standing("NAT gateway (1; data processed comes on top)", nat.usd, nat.source))
        if target in ("eks", "batch") and fsx_gib:
            # Persistent-2's SSD tiers (125, 250, 500, 1000 MB/s/TiB) are throughputCapacity values no other Lustre
            # deployment type has (Persistent-1: 50, 100, 200): the tier names the storage price.
            filters = [_match("regionCode", self.region), _match("fileSystemType", "Lustre")]
            filters += [_match("storageType", "SSD"), _match("throughputCapacity", str(fsx_per_tib))]
            usd = self._api(f"fsx:lustre-ssd-{fsx_per_tib}", "AmazonFSx", filters, "GB-Mo")
            per_gb = self._priced(usd, "GB-month", "fsx_lustre_persistent_2_gb_month", str(fsx_per_tib))
            if per_gb is not None:
                what = (
                    f"FSx for Lustre ({fsx_gib:,} GiB Persistent-2 at {fsx_per_tib} MB/s/TiB, ${per_gb.usd}/GB-month)"
                )
                lines.append(Standing(what, fsx_gib * per_gb.usd / HOURS_PER_MONTH, per_gb.source))
        return lines

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
        try:
            answer = self._client("ec2").describe_capacity_block_offerings(
                InstanceType=instance_type,
                InstanceCount=instances,
                CapacityDurationHours=block_hours,
                StartDateRange=start,
                EndDateRange=start + datetime.timedelta(days=56),
                MaxResults=100,
            )
        except Exception as error:  # noqa: BLE001 - any failure of the call is said, and the plan goes on
            return f"Capacity Block offerings: {_said(error)}"
        offers = [o for o in answer.get("CapacityBlockOfferings", []) if o.get("CurrencyCode", "USD") == "USD"]
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
        if os.environ.get(OFFLINE_ENV) == "table":
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

        config = Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2})
        region = PRICING_REGION if service == "pricing" else self.region
        return boto3.client(service, region_name=region, config=config)

    def _cache(self) -> Path:
        return state_dir() / "prices" / f"{self.region}.json"

    def _api(self, key: str, service: str, filters: list[dict], unit: str) -> float | None:
        """One price from GetProducts (the day's cache first); None: offline, or the API did not give exactly one."""
        if not self._online():
            return None
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
            price_list, token = [], None
            for _ in range(5):  # a few pages at most: the filters leave one product, or a handful
                page = self._client("pricing").get_products(
                    ServiceCode=service,
                    Filters=filters,
                    FormatVersion="aws_v1",
                    MaxResults=100,
                    **({"NextToken": token} if token else {}),
                )
                price_list += page.get("PriceList", [])
                token = page.get("NextToken")
                if not token:
                    break
        except Exception as error:  # noqa: BLE001 - any failure: the table stands in, and the plan says why
            self._note(f"price list API: {_said(error)}")
            return None
        found = on_demand_usd(price_list, unit)
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


def _said(error: Exception) -> str:
    code = getattr(error, "response", {}).get("Error", {}).get("Code")
    return f"{code or type(error).__name__}: {str(error)[:160]}"


def plan_region(recorded: str | None) -> str:
    """The region prices are for: the infra stack's, else the environment's, else the table's."""
    return recorded or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or table()["region"]


def price_rows(book: PriceBook) -> dict[str, dict[str, Price | None]]:
    """Every price the table holds (FSx's tiers aside, which only the table prices), as `book` prices it now, by the
    table's keys: {"ec2_hour": {type: price}, "sagemaker_training_hour": {ml.type: price}, "eks_cluster_hour": {...},
    "nat_gateway_hour": {...}}."""
    sagemaker = {name: book.instance_hour("sagemaker", name[3:]) for name in table()["sagemaker_training_hour"]}
    rows: dict[str, dict[str, Price | None]] = {
        "ec2_hour": {kind: book.instance_hour("eks", kind) for kind in table()["ec2_hour"]},
        "sagemaker_training_hour": sagemaker,
    }
    eks, nat = book.standing("eks", None, None)
    rows["eks_cluster_hour"] = {eks.what: Price(eks.usd_per_hour, "hour", eks.source)}
    rows["nat_gateway_hour"] = {nat.what: Price(nat.usd_per_hour, "hour", nat.source)}
    return rows


def refreshed_table(book: PriceBook) -> dict:
    """The table with those rows as the Price List API gives them today in `book.region` (FSx's tiers kept).
    Refused unless every one of them came from the API."""
    from trainkit.errors import SpecError

    rows = price_rows(book)
    stale = [name for row in rows.values() for name, price in row.items() if not _from_api(price)]
    if stale:
        why = "; ".join(book.notes) or "no AWS credentials"
        raise SpecError(f"the price list API did not price {', '.join(stale)} ({why}); the table is unchanged")
    new = json.loads(json.dumps(table()))
    new.update(as_of=book.today, region=book.region)
    for key in ("ec2_hour", "sagemaker_training_hour"):
        new[key] = {name: price.usd for name, price in rows[key].items()}
    for key in ("eks_cluster_hour", "nat_gateway_hour"):
        (new[key],) = (price.usd for price in rows[key].values())
    return new


def _from_api(price: Price | None) -> bool:
    return price is not None and price.source.startswith("price list API")


def write_table(data: dict, path: Path | None = None) -> Path:
    path = path or Path(str(files("trainkit").joinpath(*TABLE)))
    path.write_text(json.dumps(data, indent=2) + "\n")
    table.cache_clear()
    return path
