"""A SageMaker training job run here: CreateTrainingJob in the emulated account (tests/helpers/sagemaker_moto.py)
starts the job's container entry point once per host, as local processes with their own `/opt/ml` trees, and the
job moves through SageMaker's states while they run. Each rule is SageMaker's, from the page named beside it:

- The container contract (Developer Guide, "Containers with custom training algorithms"; trainkit/backends/
  sagemaker/host.py reads it): `/opt/ml/input/config/resourceconfig.json` with `current_host`, `hosts` (algo-1 ..
  algo-N) and `network_interface_name`; each input channel's S3 objects under `/opt/ml/input/data/<channel>/`
  (File mode downloads before the container starts; FastFile streams on first read, which a copy stands for here);
  the request's `Environment` and `TRAINING_JOB_NAME`; `ContainerEntrypoint` run as the container's process.
- Checkpoints ("Checkpoints in Amazon SageMaker AI"): at start the checkpoint prefix is copied into every host's
  `CheckpointConfig.LocalPath`, and nothing added to it later; while the job runs, what each host writes or deletes
  there is written or deleted under the prefix (here: every SYNC_S, and once more at the end), every host under
  the same keys (tests/helpers/sagemaker_sync.py has the rules and this stand-in's reading of the rest).
- Output ("How Amazon SageMaker AI Processes Training Output"): when every host exited 0, `/opt/ml/model` of all
  hosts is packed into `<S3OutputPath>/<job>/output/model.tar.gz`; a host that exits non-zero fails the job with
  its `/opt/ml/output/failure` text as the FailureReason (the other hosts are stopped).
- States (API reference, DescribeTrainingJob: TrainingJobStatus InProgress | Completed | Failed | Stopping |
  Stopped; SecondaryStatus Starting, Downloading, Training, Uploading, Completed, Failed, Stopping, Stopped ...),
  each secondary status a transition with its start and end time; TrainingTimeInSeconds and, as nothing here is
  spot, BillableTimeInSeconds the same.
- Logs ("Log Amazon SageMaker AI Events with Amazon CloudWatch"): each host's output to the log group
  `/aws/sagemaker/TrainingJobs`, stream `<job>/algo-<n>-<epoch seconds>`.
- Metrics (API reference, MetricDefinition: its Regex "searches the output of a training job and gets the value of
  the metric"; Developer Guide, "Define metrics": the value is the regex's first group): every host's log lines are
  searched with each definition, and DescribeTrainingJob's FinalMetricDataList ("the names, values, and dates and
  times that the training algorithm emitted") holds each metric's last value and when it was logged.
- StopTrainingJob (API reference: "sends the algorithm the SIGTERM signal, which delays job termination for 120
  seconds"): SIGTERM to every host's entry point (a container's first process), SIGKILL to all its processes after
  the grace (GRACE_S here, shorter than 120 s so tests stay short),
  the checkpoints uploaded, then Stopped.
- The stopping condition (API reference, StoppingCondition: "When the job reaches the time limit, SageMaker ends
  the job ... SageMaker sends the algorithm the SIGTERM signal, which delays job termination for 120 seconds";
  MaxRuntimeInSeconds: "The default value is 1 day"): once the job has trained MaxRuntimeInSeconds it is stopped as
  StopTrainingJob stops it (Stopping, SIGTERM, the grace, SIGKILL, the checkpoints uploaded) and ends Stopped with
  SecondaryStatus MaxRuntimeExceeded and no FailureReason (DescribeTrainingJob: under Stopped, "MaxRuntimeExceeded -
  The job stopped because it exceeded the maximum allowed runtime"; FailureReason is a failed job's). The clock is
  this stand-in's reading: it starts with the first Training status, as waiting for instances is what
  MaxWaitTimeInSeconds adds ("the amount of time spent waiting for Spot capacity plus the amount of time the job can
  run"), and a spot restart does not reset it (with a RetryStrategy "the maximum time for all of the attempts in
  total").

- Network (Developer Guide, "How Amazon SageMaker AI Runs Your Training Image" and "Distributed Training
  Configuration": hosts are named algo-1 .. algo-N, and resourceconfig.json names the interface between them):
  each host runs in a network and UTS namespace of its own (tests/helpers/netns.py), its interface eth0 at an
  address of the job's test network, fresh instances (a spot restart) at fresh addresses. Its hostname is an
  instance's own, not `algo-N` (the container's hostname is not its host name on SageMaker: AWS's own images patch
  gethostname(), sagemaker-training-toolkit's src/sagemaker_training/c/gethostname.c); the `algo-N` names resolve
  only through the hosts file written for the host. The AWS APIs are reached through the network's gateway.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

from tests.helpers.containers import kill_after_grace, pump_lines, signal_container, start_container
from tests.helpers.netns import Network
from tests.helpers.paths import REPO
from tests.helpers.sagemaker_sync import CheckpointSync
from training.spec import SPEC_FILE
from trainkit.backends.sagemaker.request import LAUNCH_CHANNEL, TAG_RUN

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
SYNC_S = 1.0
GRACE_S = 30.0
DEFAULT_MAX_RUNTIME_S = 86400  # StoppingCondition.MaxRuntimeInSeconds when the request has none: 1 day


class Job:
    """One training job's run: its hosts' processes, the S3 sync, the states."""

    def __init__(self, fake, request: dict, folder: Path, clients, run_env: dict | None = None):
        """`run_env`: run id -> variables a test adds to the hosts of that run's jobs (its trainkit:run-id tag)."""
        self.fake, self.request, self.clients = fake, request, clients
        run = {tag["Key"]: tag["Value"] for tag in request.get("Tags", [])}.get(TAG_RUN)
        self.extra_env = dict((run_env or {}).get(run, {}))
        self.name = request["TrainingJobName"]
        self.count = request["ResourceConfig"]["InstanceCount"]
        self.hosts = [f"algo-{i + 1}" for i in range(self.count)]
        self.folder = folder / self.name
        self.processes: dict[str, subprocess.Popen] = {}
        self.stopping = threading.Event()
        self.no_sync = threading.Event()  # set: the instances are gone at once, nothing more is uploaded
        self.syncs: dict[str, CheckpointSync] = {}  # host -> its checkpoint sync, on the instance started last
        self.interrupted: str | None = None
        condition = request.get("StoppingCondition") or {}
        self.max_runtime = condition.get("MaxRuntimeInSeconds", DEFAULT_MAX_RUNTIME_S)
        self.training_since: float | None = None  # when the job first reached Training: the stopping condition's clock
        self.expired = False  # stopped at MaxRuntimeInSeconds
        self.attempt = 0
        self.started = time.time()
        self.stamp = 0  # the epoch seconds in the log streams' names of the latest start of the instances
        self.lock = threading.Lock()
        self.network = Network()  # opened when the job runs, closed when it ends or by kill()
        definitions = request["AlgorithmSpecification"].get("MetricDefinitions", [])
        self.metric_rules = [(d["Name"], re.compile(d["Regex"])) for d in definitions]
        self.fake.final_metric_data_list = []
        self.fake.secondary_status_transitions = []
        self._state("InProgress", "Starting", "Preparing the instances for training")

    # ---------------------------------------------------------------- states

    def _state(self, status: str, secondary: str, message: str) -> None:
        now = time.time()
        with self.lock:
            transitions = self.fake.secondary_status_transitions
            if transitions and "EndTime" not in transitions[-1]:
                transitions[-1]["EndTime"] = now
            transitions.append({"Status": secondary, "StartTime": now, "StatusMessage": message})
            if status in ("Completed", "Failed", "Stopped"):  # the job has ended
                transitions[-1]["EndTime"] = now
                seconds = int(now - self.started)
                self.fake.training_time_in_seconds = self.fake.billable_time_in_seconds = seconds
            self.fake.training_job_status, self.fake.secondary_status = status, secondary

    # ---------------------------------------------------------------- S3

    def _s3_parts(self, uri: str) -> tuple[str, str]:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return bucket, key

    def _download(self, uri: str, target: Path, folder: bool = True) -> None:
        """The objects whose keys start with `uri`'s into `target`. `folder` (the checkpoint prefix, synced with its
        local path): the key's part after the prefix, a leading `/` aside, is the local path; the prefix is taken as
        given, so one without its trailing `/` (`.../exp1`) restores `.../exp10/...` too, as SageMaker does
        (syne-tune/syne-tune#363; where such keys land is this stand-in's reading). Otherwise (a channel's S3Prefix:
        "all objects that match the specified key name prefix", API reference, S3DataSource) the key's part after the
        prefix's last `/` is the local path, so one object lands under its own name; that landing is this stand-in's
        reading, not a documented rule (docs/sagemaker.md lists it as cloud-only)."""
        s3 = self.clients("s3")
        bucket, prefix = self._s3_parts(uri)
        kept = prefix if folder else prefix[: prefix.rfind("/") + 1]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                path = target / item["Key"][len(kept) :].lstrip("/")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())

    def _sync_up(self, host: str) -> None:
        """One pass of the host's checkpoint sync: its writes and deletions to the checkpoint prefix."""
        if host in self.syncs:
            self.syncs[host].push()

    # ---------------------------------------------------------------- hosts

    def _prepare(self, host: str) -> Path:
        """A fresh instance's /opt/ml: nothing of an earlier attempt's disk survives."""
        root = self.folder / f"attempt-{self.attempt}" / host / "opt" / "ml"
        config = root / "input" / "config"
        config.mkdir(parents=True)
        resource = {"current_host": host, "hosts": self.hosts, "network_interface_name": "eth0"}
        (config / "resourceconfig.json").write_text(json.dumps(resource))
        (config / "hyperparameters.json").write_text(json.dumps(self.request.get("HyperParameters", {})))
        for channel in self.request.get("InputDataConfig", []):
            uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
            self._download(uri, root / "input" / "data" / channel["ChannelName"], folder=False)
        spec = root / "input" / "data" / LAUNCH_CHANNEL / SPEC_FILE
        if spec.is_file():  # a server of the test's named by 127.0.0.1 (an MLflow server) is reached as env's are
            spec.write_text(self.network.reached(spec.read_text()))
        (root / "checkpoints").mkdir()
        if self.request.get("CheckpointConfig"):
            uri = self.request["CheckpointConfig"]["S3Uri"]
            self._download(uri, root / "checkpoints")
            self.syncs[host] = CheckpointSync(self.clients("s3"), uri, root / "checkpoints")  # what came in is in S3
        (root / "model").mkdir()
        (root / "output").mkdir()
        return root

    def _pump(self, host: str, process: subprocess.Popen, stamp: int) -> None:
        """The host's output to its CloudWatch stream, a line at a time. Each start of an instance has its own
        stream (`<job>/algo-<n>-<epoch seconds>`), so a spot restart writes a new one; CloudWatch takes no empty
        message (PutLogEvents: InputLogEvent.message, minimum length 1), so blank lines are left out."""
        logs = self.clients("logs")
        stream = f"{self.name}/{host}-{stamp}"
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)

        def put(message: str) -> None:
            event = {"timestamp": int(time.time() * 1000), "message": message}
            logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=[event])
            self._metrics(message, time.time())

        pump_lines(process, put)

    def _metrics(self, line: str, when: float) -> None:
        """A log line's values for the request's metric definitions: each metric's latest, as FinalMetricDataList."""
        for name, regex in self.metric_rules:
            found = regex.search(line)
            if found:
                with self.lock:
                    kept = [m for m in self.fake.final_metric_data_list if m["MetricName"] != name]
                    value = {"MetricName": name, "Value": float(found.group(1)), "Timestamp": when}
                    self.fake.final_metric_data_list = [*kept, value]

    def run(self) -> None:
        try:
            self.network.__enter__()
            self._run()
        except Exception as error:  # the stand-in's own fault: the job fails saying so
            self.fake.failure_reason = f"stand-in error: {type(error).__name__}: {error}"
            self._state("Failed", "Failed", "Training job failed")
        finally:
            self.network.close()

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            self.clients("logs").create_log_group(logGroupName=LOG_GROUP)
        self._state("InProgress", "Downloading", "Downloading input data")
        while True:
            roots = {host: self._prepare(host) for host in self.hosts}
            self._state("InProgress", "Training", "Training image download completed. Training in progress.")
            self.training_since = self.training_since or time.time()
            codes, failed = self._run_hosts(roots)
            if self.interrupted is None:
                break
            # A spot interruption: the job restarts on fresh instances with the checkpoint prefix restored
            # (Developer Guide, "Managed Spot Training": "the training job is restarted ... from the checkpoint").
            self.interrupted = None
            self.attempt += 1
            self._state("InProgress", "Starting", "Restarting training on new spot capacity after an interruption")
        if self.expired:
            self._state("Stopped", "MaxRuntimeExceeded", "The job exceeded MaxRuntimeInSeconds and was stopped")
        elif self.stopping.is_set():
            self._state("Stopped", "Stopped", "The job was stopped")
        elif failed is not None or any(codes.values()):
            host, code = failed or next((h, c) for h, c in codes.items() if c)
            reason_file = roots[host] / "output" / "failure"
            reason = reason_file.read_text()[:1024] if reason_file.is_file() else f"exit code {code}"
            self.fake.failure_reason = f"AlgorithmError: {reason}"
            self._state("Failed", "Failed", "Training job failed")
        else:
            self._state("InProgress", "Uploading", "Uploading generated training model")
            self._upload_model(roots)
            self._state("Completed", "Completed", "Training job completed")

    def _run_hosts(self, roots: dict) -> tuple[dict, tuple | None]:
        """One attempt: every host's entry point until all have exited; (exit codes, the first host that failed)."""
        instances = {host: self.network.add(f"{self.attempt}/{host}") for host in roots}
        names = {host: instance.address for host, instance in instances.items()}
        for instance in instances.values():
            self.network.write_hosts(instance, names)
        self.stamp = max(int(time.time()), self.stamp + 1)
        entry = self.request["AlgorithmSpecification"]["ContainerEntrypoint"]
        self.processes, pumps = {}, []
        for host, root in roots.items():
            env = {
                **os.environ,
                **self.request.get("Environment", {}),
                **self.extra_env,
                "TRAINING_JOB_NAME": self.name,
                "TRAINKIT_SAGEMAKER_ROOT": str(root),
                "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1",
            }
            on = functools.partial(self.network.command, instances[host])
            process = start_container(entry, root, self.network.reach(env), on)
            self.processes[host] = process
            pump = threading.Thread(target=self._pump, args=(host, process, self.stamp), daemon=True)
            pump.start()
            pumps.append(pump)
        failed = None
        while any(p.poll() is None for p in self.processes.values()):
            if self._past_max_runtime():
                self.expired = True
                self.stop()
            if not self.no_sync.is_set():
                for host in roots:
                    self._sync_up(host)
            for host, process in self.processes.items():
                ended = process.poll() not in (None, 0)
                if ended and failed is None and not self.stopping.is_set() and self.interrupted is None:
                    failed = (host, process.returncode)
                    self._signal_all(signal.SIGTERM)  # the job ends: the other hosts are stopped
            time.sleep(SYNC_S if not (self.stopping.is_set() or self.interrupted) else 0.2)
        for pump in pumps:
            pump.join(timeout=30)
        if not self.no_sync.is_set():  # an abrupt loss of the instances uploads nothing more
            for host in roots:
                self._sync_up(host)
        self.no_sync.clear()
        return {host: process.returncode for host, process in self.processes.items()}, failed

    def _past_max_runtime(self) -> bool:
        """Whether the stopping condition ends the job now: trained MaxRuntimeInSeconds, and neither stopping nor
        between a spot interruption and its restart already."""
        if self.stopping.is_set() or self.interrupted is not None or self.training_since is None:
            return False
        return time.time() - self.training_since >= self.max_runtime

    def _upload_model(self, roots: dict) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for root in roots.values():
                for path in sorted((root / "model").rglob("*")):
                    if path.is_file():
                        archive.add(path, arcname=str(path.relative_to(root / "model")))
        bucket, prefix = self._s3_parts(self.request["OutputDataConfig"]["S3OutputPath"])
        key = f"{prefix.rstrip('/')}/{self.name}/output/model.tar.gz"
        self.clients("s3").put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())

    def _signal_all(self, sig: int) -> None:
        """As a container runtime stops a container (Docker CLI reference, `docker stop`: the container's main
        process gets SIGTERM, then SIGKILL after a grace period): SIGTERM reaches each host's entry point only, which
        passes it on; SIGKILL goes to the entry point's process group, and what runs in sessions of its own
        (torchrun's workers, their loader workers) dies with its parent (PR_SET_PDEATHSIG), as in a container
        whose first process is gone."""
        for process in self.processes.values():
            signal_container(process, sig)

    def interrupt(self, grace: bool) -> None:
        """A spot interruption (Developer Guide, "Managed Spot Training"): with `grace`, SIGTERM and the grace
        period before the instances go (what the hosts have synced by then is kept); without, the instances are
        gone at once (SIGKILL, no further upload). Then the job restarts on fresh instances."""
        with self.lock:
            if self.fake.secondary_status != "Training":  # only running instances can be reclaimed
                raise RuntimeError(f"{self.name} is {self.fake.secondary_status}, not Training: nothing to interrupt")
            self.interrupted = "grace" if grace else "abrupt"
        self._state("InProgress", "Interrupted", "The spot capacity was reclaimed")
        if not grace:
            self.no_sync.set()
            self._signal_all(signal.SIGKILL)
            return
        self._signal_all(signal.SIGTERM)
        self._kill_after_grace()

    def _kill_after_grace(self) -> None:
        """SIGKILL to every host's processes still running after GRACE_S, in the background."""
        processes = list(self.processes.values())
        threading.Thread(target=kill_after_grace, args=(lambda: processes, GRACE_S, 0.2), daemon=True).start()

    def kill(self) -> None:
        """The account goes away: nothing of the job may outlive the test."""
        self.stopping.set()
        self._signal_all(signal.SIGKILL)
        self.network.close()

    def stop(self) -> None:
        """StopTrainingJob: SIGTERM, the grace, then SIGKILL (the run loop records Stopped)."""
        self.stopping.set()
        self._state("Stopping", "Stopping", "Stopping the training job")
        self._signal_all(signal.SIGTERM)
        self._kill_after_grace()
