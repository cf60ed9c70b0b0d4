"""The scaling model held against published scaling tables (`invoke plan --published`): each table's workload
(trainkit/tables/published_scaling.json), the model's prediction beside the published efficiency, and where the
two differ; and, beside a table that names GPU instances (`predict_on`: the DL1 BERT 1.5B anchor), the same job
as trainkit's planner predicts it on them."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib.resources import files

from trainkit.plan.scaling_model import FABRICS, GIB, MIB, StepCost, allreduce_busbw, curve, predict


def published_tables() -> dict:
    return json.loads(files("trainkit").joinpath("tables", "published_scaling.json").read_text())


def resolved(workload: dict) -> dict:
    """A table's workload with a registry model's figures filled in: a workload that names `model` (the BERT
    rows) takes its parameter count (BertForMaskedLM's exact one), tokens per sequence and FLOPs per token (the
    planner's and the trainer's formula, training/common/flops.py) from the registry entry (training/registry.py),
    not from numbers of its own."""
    if "model" not in workload:
        return workload
    from trainkit.job.models import get_model

    entry = get_model(workload["model"])
    seq = entry.recipe.seq_len
    flops = entry.arch.shape().flops_per_token(seq)
    return {"params": entry.arch.parameters(), "tokens_per_item": seq, "flops_per_token": flops, **workload}


def items_per_device(workload: dict) -> int:
    """Sequences (or images) one accelerator takes per optimizer step."""
    return workload["per_device_batch"] * workload.get("micro_batches", 1)


def _workload_of(name: str, tables: dict) -> StepCost:
    """A published table's workload from its stated parameters. Compute per step: from the table's own one-node
    throughput (what that row measured, its own exposed communication taken out), from the FLOP rate another
    table's accelerator reached, or calibrated on one row (which is then a fit, not a prediction)."""
    entry = tables[name]
    w, fabric = resolved(entry["workload"]), FABRICS[entry["family"]]
    items = items_per_device(w)
    workload = StepCost(
        params=w["params"],
        compute_s=1.0,
        micro_batches=w.get("micro_batches", 1),
        largest_unit=w.get("largest_unit", w["params"]),
        param_bytes=w.get("param_bytes", 2),
        grad_bytes=w.get("grad_bytes", 2),
    )
    compute = w["compute"]
    if compute == "one_node_throughput":
        one_node_step = items * fabric.per_node / entry["published"]["throughput"][0]
        exposed = predict(replace(workload, compute_s=one_node_step), w["strategy"], 1, fabric).exposed_s
        return replace(workload, compute_s=one_node_step - exposed)
    if "achieved_tflops_like" in compute:
        rate = achieved_flops_per_device(compute["achieved_tflops_like"], tables)
        return replace(workload, compute_s=items * w["tokens_per_item"] * w["flops_per_token"] / rate)
    nodes = compute["calibrated_on"]
    target = dict(zip(entry["published"]["nodes"], published_efficiency(entry), strict=True))[nodes]

    def efficiency(compute_s):
        return curve(replace(workload, compute_s=compute_s), w["strategy"], fabric, (nodes,))[0].efficiency

    return replace(workload, compute_s=solve_rising(efficiency, target))


def solve_rising(function, target: float, low: float = 1e-6, high: float = 1e6) -> float:
    """x in [low, high] where a rising function reaches target (bisection in log space)."""
    for _ in range(200):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if function(middle) < target else (low, middle)
    return math.sqrt(low * high)


def fit_inter_efficiency(name: str, nodes: int) -> float:
    """The inter-node link efficiency that makes a published efficiency table's row at `nodes` come out exactly:
    how a family's efficiency is found where its only published figures are a training table (dl1)."""
    tables = published_tables()
    entry = tables[name]
    fabric = FABRICS[entry["family"]]
    workload = _workload_of(name, tables)  # the one-node anchor does not cross the network
    target = dict(zip(entry["published"]["nodes"], published_efficiency(entry), strict=True))[nodes]

    def efficiency(inter_efficiency):
        fitted = replace(fabric, inter_efficiency=inter_efficiency)
        return curve(workload, entry["workload"]["strategy"], fitted, (nodes,))[0].efficiency

    return solve_rising(efficiency, target, 1e-4, 1.0)


def achieved_flops_per_device(name: str, tables: dict) -> float:
    """FLOP/s one accelerator reached in a published table's one-node row."""
    entry = tables[name]
    w, fabric = resolved(entry["workload"]), FABRICS[entry["family"]]
    tokens_per_s = entry["published"]["throughput"][0] / fabric.per_node * w["tokens_per_item"]
    return tokens_per_s * w["flops_per_token"]  # a registry model's (resolved): the planner's formula


def published_efficiency(entry: dict) -> list[float]:
    """Per-node-throughput efficiency from what the table publishes: throughput, time to train, or efficiency."""
    published = entry["published"]
    nodes = published["nodes"]
    if "efficiency" in published:
        return published["efficiency"]
    if "throughput" in published:
        values = published["throughput"]
        return [v / values[0] / (n / nodes[0]) for v, n in zip(values, nodes, strict=True)]
    minutes = published["minutes"]
    return [minutes[0] / m / (n / nodes[0]) for m, n in zip(minutes, nodes, strict=True)]


def compare_published(llm_curves=None) -> list[dict]:
    """Every published row beside the model's prediction: table, at (nodes or size), published, predicted,
    error (predicted - published: efficiency points, or relative for bandwidth), fit (a row the model was fitted
    or normalised on). `llm_curves(model, nodes) -> [Point]` predicts trainkit's own jobs for the near-linear
    claim (trainkit.plan.memory supplies it; the model here knows no recipes)."""
    rows = []
    tables = published_tables()
    for name, entry in tables.items():
        if name.startswith("_"):
            continue
        fabric = FABRICS[entry["family"]]
        if entry["kind"] == "allreduce_busbw":
            for size, busbw in zip(entry["published"]["bytes"], entry["published"]["busbw_gb_s"], strict=True):
                predicted = allreduce_busbw(size, entry["nodes"], fabric) / 1e9
                fit = _size(size) in entry["fitted_rows"]
                rows.append(_row(name, entry, _size(size), busbw, predicted, (predicted - busbw) / busbw, fit))
        elif entry["kind"] == "near_linear":
            if llm_curves is None:
                continue
            floor = entry["published"]["at_least"]
            for model in entry["models"]:
                points = llm_curves(model, entry["published"]["nodes"])
                for point in points:
                    at = _nodes(point.nodes)
                    base = point.nodes == points[0].nodes
                    rows.append(_row(f"{name}:{model}", entry, at, floor, point.efficiency, None, base))
        else:
            nodes = entry["published"]["nodes"]
            workload = _workload_of(name, tables)
            points = curve(workload, entry["workload"]["strategy"], fabric, nodes)
            compute = entry["workload"]["compute"]
            calibrated = compute.get("calibrated_on") if isinstance(compute, dict) else None
            for n, published, point in zip(nodes, published_efficiency(entry), points, strict=True):
                error = point.efficiency - published
                fit = n in (1, calibrated) or _nodes(n) in entry.get("fitted_rows", ())
                rows.append(_row(name, entry, _nodes(n), published, point.efficiency, error, fit))
            rate = entry["published"].get("one_node_throughput")
            if rate is not None:  # a throughput the model predicts from another table's FLOP rate
                one_node = predict(workload, entry["workload"]["strategy"], 1, fabric)
                predicted = items_per_device(entry["workload"]) * fabric.per_node / one_node.step_s
                rows.append(_row(name, entry, _nodes(1), rate, predicted, (predicted - rate) / rate, False, "items/s"))
    return rows


def _row(name, entry, at, published, predicted, error, fit, unit=None) -> dict:
    return {
        "table": name,
        "at": at,
        "published": published,
        "predicted": predicted,
        "error": error,
        "fit": fit,
        "unit": unit or entry["unit"],
        "source": entry["source"],
    }


def _nodes(n: int) -> str:
    return f"{n} node" + ("s" if n > 1 else "")


def _size(size: float) -> str:
    return f"{size / GIB:g} GiB" if size >= GIB else f"{size / MIB:g} MiB"


def render_comparison(rows: list[dict]) -> str:
    """Published beside predicted with the error; rows the model was fitted on are marked 'fit'."""
    lines = [f"{'table':<32}{'at':>9}{'published':>13}{'predicted':>13}{'error':>9}"]
    for row in rows:
        mark = "  fit" if row["fit"] else ""
        if row["unit"] == "GB/s":
            cells = f"{row['published']:>8.0f} GB/s{row['predicted']:>8.0f} GB/s{row['error']:>+9.1%}"
        elif row["unit"] == "items/s":  # sequences or images a second
            cells = f"{row['published']:>8.1f} /s  {row['predicted']:>8.1f} /s  {row['error']:>+7.1%}"
        elif row["error"] is None:  # a claim, not a figure: "near-linear" = at least this efficiency
            cells = f"{'>= ' + format(row['published'], '.0%'):>13}{row['predicted']:>13.1%}{'':>9}"
        else:
            cells = f"{row['published']:>13.1%}{row['predicted']:>13.1%}{100 * row['error']:>+7.1f}pt"
        lines.append(f"{row['table']:<32}{row['at']:>9}{cells}{mark}".rstrip())
    return "\n".join(lines)


def beside_anchor(job_on) -> list[dict]:
    """Each table that names GPU instances (`predict_on`: the DL1 BERT 1.5B one) as rows: its published figures,
    the anchor, then the same job on each of those instances as trainkit's planner and scaling model predict it.
    `job_on(workload, instance_type, nodes) -> ([(nodes, items/s, efficiency)], its MFU and where it comes from)`
    (trainkit.plan.scaling supplies it: the model here knows no recipes)."""
    rows = []
    for name, entry in published_tables().items():
        if name.startswith("_") or "predict_on" not in entry:
            continue
        nodes, rate = entry["published"]["nodes"], entry["published"].get("one_node_throughput")
        workload = resolved(entry["workload"])
        for n, efficiency in zip(nodes, published_efficiency(entry), strict=True):
            items = rate * n * efficiency if rate else None  # what the table's figures say at n nodes
            rows.append(_anchor_row(name, workload, entry["instance_type"], n, items, efficiency, "published"))
        for instance_type in entry["predict_on"]:
            points, mfu_source = job_on(workload, instance_type, nodes)
            for n, items, efficiency in points:
                rows.append(_anchor_row(name, workload, instance_type, n, items, efficiency, "predicted", mfu_source))
    return rows


def _anchor_row(table, workload, instance_type, nodes, items, efficiency, source, mfu_source=None) -> dict:
    return {
        "table": table,
        "workload": workload,
        "instance_type": instance_type,
        "nodes": nodes,
        "items_per_s": items,
        "efficiency": efficiency,
        "source": source,
        "mfu_source": mfu_source,
    }


def render_beside_anchor(rows: list[dict]) -> str:
    """Per anchor table: its published rows, then each GPU instance's predicted rows, and where each comes from."""
    lines = []
    for name in dict.fromkeys(row["table"] for row in rows):
        shown = [row for row in rows if row["table"] == name]
        w = shown[0]["workload"]
        lines += [
            f"{name} (published) and the same job predicted on GPUs: {w['model']}, {w['strategy']}, "
            f"{w['per_device_batch']} x {w['micro_batches']} sequences of {w['tokens_per_item']} a GPU and step",
            f"  {'instance':<16}{'nodes':>6}{'sequences/s':>14}{'efficiency':>12}  source",
        ]
        for row in shown:
            items = f"{row['items_per_s']:>14,.1f}" if row["items_per_s"] is not None else f"{'-':>14}"
            where = f"  {row['instance_type']:<16}{row['nodes']:>6}"
            lines.append(f"{where}{items}{row['efficiency']:>12.1%}  {row['source']}")
        lines.append(
            "  published: the table's figures (sequences/s past one node: the one-node figure x nodes x the published "
            "efficiency)"
        )
        sources = dict.fromkeys((row["instance_type"], row["mfu_source"]) for row in shown if row["mfu_source"])
        lines += [
            f"  predicted on {instance_type}: trainkit's plan of {w['model']} and the scaling model, {mfu_source}"
            for instance_type, mfu_source in sources
        ]
    return "\n".join(lines)


def published_report(llm_curves, job_on) -> str:
    """What `invoke plan --published` prints: the comparison, then the anchors beside their GPU predictions."""
    return render_comparison(compare_published(llm_curves)) + "\n\n" + render_beside_anchor(beside_anchor(job_on))
