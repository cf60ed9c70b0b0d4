"""The sweep's report, written by rank 0 where the sweep ran (a local run folder, or FSx on EKS): the verdict
against what the launcher expects of the instance type, results.json's table as Markdown, and busbw.png.

The launcher passes the expectations (trainkit/workloads/nccl_test.py): `efa` when the instance type has EFA
devices, and `busbw` = (message size, published all-reduce busbw in GB/s) for two or more nodes of a type with a
published figure. Failing: a rank whose NCCL did not use the libfabric plugin over EFA, or no NCCL at all (a sweep over
gloo means the process saw no GPU). Warning: the largest all-reduce at or above the published size below half
the published figure.
"""

from __future__ import annotations

from pathlib import Path

GLOO_ON_EFA = (
    "the sweep ran over gloo, not NCCL: the processes saw no GPU (request nvidia.com/gpu as the training jobs do, "
    "on a GPU instance type)"
)


def verdict(record: dict, expect_efa: bool, expect_busbw: tuple[int, float] | None) -> tuple[list[str], list[str]]:
    """(failures, warnings) of one sweep's record."""
    failures, warnings = [], []
    if expect_efa:
        if record["backend"] != "nccl":
            failures.append(GLOO_ON_EFA)
        for rank, net in sorted(record.get("net", {}).items()):
            if not net["efa"]:
                failures.append(f"{rank}: NCCL did not use EFA (network {net['network']}): {net['cause']}")
    if expect_busbw and record["nodes"] >= 2:
        size, expected = expect_busbw
        measured = [r for r in record["results"] if r["op"] == "all_reduce" and r["size_bytes"] >= size * 0.99]
        if measured and measured[-1]["busbw_gbps"] < expected / 2:
            warnings.append(
                f"all_reduce busbw {measured[-1]['busbw_gbps']:.1f} GB/s at {measured[-1]['size_bytes']} B is below "
                f"half of the published {expected} GB/s between two nodes of this type at {size} B"
            )
    return failures, warnings


def table(record: dict) -> list[str]:
    lines = [
        f"{record['backend']} on {record['device']}: {record['world_size']} processes, {record['nodes']} node(s), "
        f"{record['dtype']}; {record['timing']}",
        "",
        "| op | size (B) | time (us) | algbw (GB/s) | busbw (GB/s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in record["results"]:
        lines.append(
            f"| {row['op']} | {row['size_bytes']} | {row['time_us']:.1f} | {row['algbw_gbps']:.3f} | "
            f"{row['busbw_gbps']:.3f} |"
        )
    return lines


def verdict_lines(record: dict) -> list[str]:
    found = record.get("verdict", {})
    return [f"warning: {w}" for w in found.get("warnings", [])] + [f"FAILED: {f}" for f in found.get("failures", [])]


def plot(record: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    for op in dict.fromkeys(row["op"] for row in record["results"]):
        rows = [row for row in record["results"] if row["op"] == op]
        axis.plot([r["size_bytes"] for r in rows], [r["busbw_gbps"] for r in rows], marker="o", label=op)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("message size (bytes)")
    axis.set_ylabel("busbw (GB/s)")
    axis.set_title(f"{record['backend']}: {record['world_size']} processes on {record['nodes']} node(s)")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")
    plt.close(figure)
    return path
