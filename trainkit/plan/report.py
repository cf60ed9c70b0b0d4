"""`invoke obs.report --run <id>`: one PNG of a run, from the files it left (no Prometheus needed).

Panels: loss, throughput and MFU over steps; and, when runs of the same model exist at two or more
world sizes in the same runs folder, measured throughput against ideal linear scaling from the
smallest one, with the scaling efficiency of each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from training.common.files import read_events, read_jsonl
from training.families import family_of
from training.spec import Job
from trainkit.errors import SpecError


@dataclass
class RunFiles:
    run_dir: Path
    job: Job
    records: list[dict]
    summary: dict | None

    @classmethod
    def read(cls, run_dir: Path, with_records: bool = True) -> RunFiles:
        """The run's files; `with_records=False` skips metrics.jsonl (other runs only need their summary)."""
        spec_path, metrics = run_dir / "spec.json", run_dir / "metrics.jsonl"
        if not spec_path.exists() or not metrics.exists():
            raise SpecError(
                f"{run_dir} is not a run with metrics (spec.json and metrics.jsonl); check --run and --runs-dir"
            )
        records = read_jsonl(metrics) if with_records else []
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        return cls(run_dir, Job.from_dict(json.loads(spec_path.read_text())), records, summary)

    @property
    def world_size(self) -> int:
        """Processes in the run's last (re)start (elastic runs change it), else as submitted."""
        starts = [e for e in read_events(self.run_dir) if e.get("event") in ("start", "resume")]
        sizes = [size for event in starts if (size := event.get("world_size"))]
        return sizes[-1] if sizes else self.job.world_size

    @property
    def rate(self) -> tuple[str, str]:
        """(the records' rate field, what it counts): the family's (training/families.py); a script's samples."""
        job = self.job
        if job.run.workload == "recipe" and job.model.family:
            counted = family_of(job.model.family).throughput
            return counted.record, counted.unit
        return "samples_per_s", "samples"


def scaling_points(runs_dir: Path, model: str, key: str) -> dict[int, float]:
    """World size -> best median throughput among finished runs of `model` in `runs_dir`."""
    points: dict[int, float] = {}
    for spec_path in sorted(runs_dir.glob("*/spec.json")):
        try:
            run = RunFiles.read(spec_path.parent, with_records=False)
        except (SpecError, ValueError):
            continue
        median = (run.summary or {}).get(f"{key}_median")
        if run.job.model.name == model and median:
            points[run.world_size] = max(points.get(run.world_size, 0.0), median)
    return points


def write_report(run_dir: Path, output: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = RunFiles.read(run_dir)
    if not run.records:
        raise SpecError(f"{run_dir}/metrics.jsonl has no steps yet; run the report after the first logged step")
    key, counted = run.rate
    unit = f"{counted}/s"
    steps = [r["step"] for r in run.records]
    figure, axes = plt.subplots(2, 2, figsize=(13, 8.5), layout="constrained")
    title = f"trainkit run {run.job.run.run_id}: {run.job.model.name}, {run.world_size} process(es)"
    figure.suptitle(title, fontsize=14)

    loss = axes[0][0]
    loss.plot(steps, [r["loss"] for r in run.records], color="tab:blue", label="training")
    evaluated = [r for r in run.records if r.get("eval_loss") is not None]
    if evaluated:  # held-out loss at each evaluation, on the same axis
        loss.plot([r["step"] for r in evaluated], [r["eval_loss"] for r in evaluated], "o-", color="tab:orange")
        loss.lines[-1].set_label("held-out")
        loss.legend()
    named = "Training and held-out loss" if evaluated else "Training loss"
    loss.set(title=named, xlabel="optimizer step", ylabel="loss (nats per token or image)")

    speed = axes[0][1]
    measured = [r for r in run.records if not r.get("warmup")]
    speed.plot([r["step"] for r in measured], [r[key] for r in measured], color="tab:green")
    speed.set(title="Throughput (whole job, warm-up step left out)", xlabel="optimizer step", ylabel=unit)

    mfu = axes[1][0]
    with_mfu = [r for r in run.records if r.get("mfu") is not None]
    mfu.set(title="Model FLOPs utilisation", xlabel="optimizer step", ylabel="MFU (% of peak)")
    if with_mfu:
        mfu.plot([r["step"] for r in with_mfu], [100 * r["mfu"] for r in with_mfu], color="tab:purple")
    else:
        mfu.text(
            0.5,
            0.5,
            "not measured: no peak FLOP/s for this device\n(give --peak-tflops)",
            ha="center",
            va="center",
            transform=mfu.transAxes,
        )

    points = scaling_points(run_dir.parent, run.job.model.name, key)
    _scaling(axes[1][1], points, unit, _prediction(run, points))
    output = output or run_dir / "report.png"
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110, metadata={"Title": title, "Software": "trainkit obs.report"})
    plt.close(figure)
    return output


def _prediction(run: RunFiles, points: dict[int, float]) -> dict[int, float] | None:
    """The scaling model's tokens/s for the run's job at its world sizes (EKS runs on p4d/p5 family nodes)."""
    if run.rate[0] != "tokens_per_s":
        return None
    from trainkit.plan.scaling import predicted_throughput

    sizes = sorted(set(points) | {run.world_size})
    try:
        return predicted_throughput(run.job, [*sizes, 2 * sizes[-1], 4 * sizes[-1]])  # and where it would go next
    except SpecError:  # a job the planner would not plan (the report is about what ran)
        return None


def _scaling(axis, points: dict[int, float], unit: str, predicted: dict[int, float] | None = None) -> None:
    """Measured throughput per world size against linear from the smallest, and the scaling model's prediction
    (`invoke plan --scaling`) for the job's instance type where it has one."""
    axis.set(title="Scaling (median throughput per world size)", xlabel="processes (GPUs)", ylabel=unit)
    if predicted:
        sizes = sorted(predicted)
        axis.plot(
            sizes, [predicted[n] for n in sizes], ":", color="tab:blue", label="predicted (invoke plan --scaling)"
        )
    if len(points) < 2 and not predicted:
        _empty(axis)
        axis.text(
            0.5,
            0.5,
            "one world size so far: run this model with other\n--nodes/--nproc in the same runs folder",
            ha="center",
            va="center",
            transform=axis.transAxes,
        )
        return
    if len(points) < 2:
        axis.plot(list(points), list(points.values()), "o", color="tab:orange", label="measured")
        axis.legend(loc="upper left")
        return
    sizes = sorted(points)
    base = points[sizes[0]] / sizes[0]
    axis.plot(sizes, [base * n for n in sizes], "--", color="grey", label="ideal (linear from smallest)")
    axis.plot(sizes, [points[n] for n in sizes], "o-", color="tab:orange", label="measured")
    for n in sizes:
        axis.annotate(
            f"{100 * points[n] / (base * n):.0f}%",
            (n, points[n]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    axis.set_xticks(sizes)
    axis.legend(loc="upper left")


def _empty(axis) -> None:
    """No ticks on a panel that has nothing to plot (no axis values that mean nothing)."""
    axis.set_xticks([])
    axis.set_yticks([])


def report_run(run_id: str, runs_dir: str, output: str | None) -> str:
    run_dir = Path(runs_dir) / run_id
    if not run_dir.is_dir():
        from trainkit.backends import backend_of

        backend = backend_of(run_id, None, runs_dir)  # a run on a target that keeps its files elsewhere (S3)
        if backend.fetch_run_files(run_id, run_dir):
            written = write_report(run_dir, Path(output) if output else None)
            return f"report written: {written.resolve()} (files of {backend.name} run {run_id} copied to {run_dir})"
        known = sorted(p.parent.name for p in Path(runs_dir).glob("*/metrics.jsonl"))
        hint = f"runs there: {', '.join(known)}" if known else "no runs there"
        raise SpecError(f"--run {run_id!r}: no folder {run_dir} ({hint}); check --run and --runs-dir")
    written = write_report(run_dir, Path(output) if output else None)
    return f"report written: {written.resolve()}"
