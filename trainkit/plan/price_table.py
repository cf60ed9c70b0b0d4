"""The shipped price table (trainkit/tables/prices.json) as the Price List API prices its rows today: shown by
`invoke infra.prices`, and rewritten from the API by its --refresh-table (a maintainer's step, with credentials)."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from trainkit.errors import SpecError
from trainkit.plan.prices import TABLE, Price, PriceBook, table


def price_rows(book: PriceBook) -> dict[str, dict[str, Price | None]]:
    """Every price the table holds, as `book` prices it now, by the table's keys and rows."""
    t = table()
    eks, nat = book.standing(None, None)
    return {
        "ec2_hour": {kind: book.instance_hour("eks", kind) for kind in t["ec2_hour"]},
        "sagemaker_training_hour": {
            name: book.instance_hour("sagemaker", name[3:]) for name in t["sagemaker_training_hour"]
        },
        "eks_cluster_hour": {eks.what: Price(eks.usd_per_hour, "hour", eks.source)},
        "nat_gateway_hour": {nat.what: Price(nat.usd_per_hour, "hour", nat.source)},
        "fsx_lustre_persistent_2_gb_month": {
            tier: book.fsx_gb_month(int(tier)) for tier in t["fsx_lustre_persistent_2_gb_month"]
        },
    }


def refreshed_table(book: PriceBook) -> dict:
    """The table with every row as the Price List API gives it today in `book.region`; refused unless the API priced
    every one (a table mixing dates would carry one it does not have)."""
    rows = price_rows(book)
    stale = [name for row in rows.values() for name, price in row.items() if not _from_api(price)]
    if stale:
        why = "; ".join(book.notes) or "no AWS credentials"
        raise SpecError(f"the price list API did not price {', '.join(stale)} ({why}); the table is unchanged")
    new = json.loads(json.dumps(table()))
    new.update(as_of=book.today, region=book.region)
    for key, row in rows.items():
        prices = {name: price.usd for name, price in row.items()}
        new[key] = prices if isinstance(table()[key], dict) else next(iter(prices.values()))
    return new


def _from_api(price: Price | None) -> bool:
    return price is not None and price.source.startswith("price list API")


def write_table(data: dict, path: Path | None = None) -> Path:
    path = path or Path(str(files("trainkit").joinpath(*TABLE)))
    path.write_text(json.dumps(data, indent=2) + "\n")
    table.cache_clear()
    return path
