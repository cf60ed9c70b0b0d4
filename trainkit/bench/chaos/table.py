"""What a scenario run looks like to a reader: one line per result, and the README's elastic table."""

from __future__ import annotations

from pathlib import Path

from trainkit.bench.chaos.scenarios import Result


def describe(result: Result) -> str:
    status = "ok" if result.ok else "UNEXPECTED"
    if result.outcome == "error":
        detail = f"error after {result.seconds_to_error} s: {result.error}"
    else:
        detail = (
            f"{result.outcome}: restarts {result.restarts}, recovery {result.recovery_s} s, "
            f"steps lost {result.steps_lost}, final step {result.final_step} (world {result.final_world_size}), "
            f"loss delta {result.loss_delta}"
        )
    problems = f" [{'; '.join(result.problems)}]" if result.problems else ""
    return f"{status:10} {result.scenario:12} {result.backend:5} {detail} ({result.seconds} s){problems}"


TABLE_START, TABLE_END = "<!-- elastic-table:start -->", "<!-- elastic-table:end -->"


def render_table(record: dict) -> str:
    """The README table for a benchmark record."""
    rows = [
        "| scenario | rdzv | outcome | restarts | recovery (s) | steps lost | final step | final loss vs no fault |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(value) -> str:
        return "-" if value is None else str(value)

    for r in record["results"]:
        outcome = r["outcome"] if r["ok"] else f"{r['outcome']} (expected {r['expected']})"
        if r["outcome"] == "error":
            outcome += f" in {r['seconds_to_error']} s"
        delta = r["loss_delta"]
        delta = "-" if delta is None else "0" if delta == 0 else f"{delta:+.0e}"
        rows.append(
            f"| {r['scenario']} | {r['backend']} | {outcome} | {cell(r['restarts'])} | {cell(r['recovery_s'])} "
            f"| {cell(r['steps_lost'])} | {cell(r['final_step'])} | {delta} |"
        )
    return "\n".join(rows)


def update_readme(readme: Path, record: dict) -> None:
    text = readme.read_text()
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    if not rest:
        raise RuntimeError(f"{readme} has no {TABLE_START} marker")
    readme.write_text(f"{head}{TABLE_START}\n{render_table(record)}\n{TABLE_END}{tail}")


def readme_table(readme: Path) -> str:
    text = readme.read_text()
    return text.partition(TABLE_START)[2].partition(TABLE_END)[0].strip()
