"""A user's script as a workload, in process: what is refused before anything starts, which files travel and the
hash that names them, the run id of a command, the workload's JSON, the EKS objects that carry the code, and the
step report's contract (training/script.py)."""

from __future__ import annotations

import base64
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from trainkit.backends import job_from_flags
from trainkit.backends.eks import render, submission
from trainkit.errors import SpecError
from trainkit.run.code import CODE_LIMIT_BYTES, code_digest, code_files, read_code
from trainkit.run.workload import WORKLOAD_ENV, Workload
from trainkit.workloads.packages import package_cache
from trainkit.workloads.script import run_id_for, script_workload


@pytest.fixture
def folder(tmp_path):
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print('hello')\n")
    (code / "pkg" / "__init__.py").write_text("")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (code / ".git").mkdir()
    (code / ".git" / "HEAD").write_text("ref\n")
    (code / ".env").write_text("SECRET=1\n")
    return code


def job(**flags):
    return job_from_flags({"workload": "script", "run_id": "mine", "nproc": 1, **flags})


def test_the_code_that_travels_leaves_out_hidden_entries_and_caches(folder):
    assert sorted(code_files(folder)) == ["pkg/__init__.py", "train.py"]


def test_a_runs_folder_inside_the_scripts_folder_is_no_code(folder, monkeypatch):
    """`invoke run --script train.py` typed in the script's folder keeps its runs in ./runs: what the preparation
    writes there while it hashes the code (and any checkpoint) never travels, and the hash does not move."""
    monkeypatch.chdir(folder)
    spec = job(runs_dir="runs")
    workload = script_workload(spec, "train.py", [])
    (folder / "runs" / "mine").mkdir(parents=True)
    (folder / "runs" / "mine" / "spec.json").write_text("{}")
    assert sorted(code_files(folder, "runs")) == ["pkg/__init__.py", "train.py"]
    assert Path(workload.script).parent.name == code_digest(read_code(folder, spec.run.runs_dir))


def test_a_configmap_volume_of_links_reads_as_the_same_code(folder, tmp_path):
    """A ConfigMap volume is links into a hidden `..data` folder: the same files, the same hash."""
    mounted = tmp_path / "mounted"
    data = mounted / "..2026_11_25_16_00_00.1"
    (data / "pkg").mkdir(parents=True)
    (data / "train.py").write_text("print('hello')\n")
    (data / "pkg" / "__init__.py").write_text("")
    (mounted / "..data").symlink_to(data.name)
    (mounted / "train.py").symlink_to("..data/train.py")
    (mounted / "pkg").symlink_to("..data/pkg")
    assert code_digest(read_code(mounted)) == code_digest(read_code(folder))


def test_an_edit_changes_the_hash_that_names_the_code_folder(folder):
    before = code_digest(read_code(folder))
    (folder / "train.py").write_text("print('changed')\n")
    assert code_digest(read_code(folder)) != before


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda code: code / "missing.py", "not a Python file"),
        (lambda code: code / "pkg", "not a Python file"),
        (lambda code: (code / "big.bin").write_bytes(b"x" * (CODE_LIMIT_BYTES + 1)) and code / "train.py", "big.bin"),
    ],
)
def test_a_script_that_cannot_travel_is_refused_saying_what_to_do(folder, make, message):
    with pytest.raises(SpecError, match=message) as error:
        script_workload(job(), str(make(folder)), [])
    if message == "big.bin":
        assert "a folder of their own" in str(error.value) and "--image" in str(error.value)


@pytest.mark.parametrize(
    ("lines", "wheelhouse", "message"),
    [
        ("-e .\n", None, "names a path on this machine"),
        ("# nothing\n\n", None, "lists no package"),
        (None, "wheels", "give --requirements too"),
    ],
)
def test_requirements_the_nodes_could_not_install_are_refused(folder, tmp_path, lines, wheelhouse, message):
    requirements = None
    if lines is not None:
        requirements = tmp_path / "requirements.txt"
        requirements.write_text(lines)
    with pytest.raises(SpecError, match=message):
        script_workload(job(), str(folder / "train.py"), [], str(requirements) if requirements else None, wheelhouse)


WHEELHOUSE = "put the wheels in a folder and give it as --wheelhouse (eks and batch: a folder on FSx)"
OPTION = (
    "is a pip option, which would apply to every package of the install (another index or link source, trusted "
    "hosts, pre-releases, no hash checking); list packages only (each may carry --hash=sha256:...), and "
    f"{WHEELHOUSE} or set the index in pip's configuration on the nodes (pip.conf or PIP_INDEX_URL in the image)"
)
CREDENTIALS = (
    "carries credentials in its URL, which would travel with the job (its spec, the pod spec, Batch's job records, "
    f"S3); {WHEELHOUSE}, or keep the credentials on the nodes (a netrc file or a keyring pip reads there) and drop "
    "them from the line"
)
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "message"),
    [
        *[
            (f"tk-extra==1.0\n{line}\n", f"line 2: {line!r} {OPTION}")
            for line in (
                "--extra-index-url https://mirror.example/simple",
                "--index-url=https://mirror.example/simple",
                "-i https://mirror.example/simple",
                "--trusted-host mirror.example",
                "-f https://mirror.example/wheels/",
                "--find-links=wheels",
                "--pre",
                "--no-require-hashes",
                "-r more.txt",
            )
        ],
        (
            "tk-extra @ https://alice:s3cret@pkgs.example/tk_extra-1.0-py3-none-any.whl\n",
            f"line 1: 'tk-extra @ https://***@pkgs.example/tk_extra-1.0-py3-none-any.whl' {CREDENTIALS}",
        ),
        (
            "tk-extra\n--extra-index-url https://__token__:pypi-AgE@pkgs.example/simple\n",
            f"line 2: '--extra-index-url https://***@pkgs.example/simple' {CREDENTIALS}",
        ),
        (
            "git+https://ghp_token@github.com/org/tk-extra.git\n",
            f"line 1: 'git+https://***@github.com/org/tk-extra.git' {CREDENTIALS}",
        ),
        (
            f"tk-extra==1.0 --hash={DIGEST} --config-settings=editable_mode=compat\n",
            "line 1: '--config-settings=editable_mode=compat' is not accepted on a requirement line (only "
            "--hash=ALG:DIGEST is); drop it, or build the package into a wheel and give its folder as --wheelhouse",
        ),
    ],
)
def test_requirement_lines_that_would_change_where_every_package_comes_from_or_leak_a_token_are_refused(
    folder, tmp_path, text, message
):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(text)
    with pytest.raises(SpecError) as refused:
        script_workload(job(), str(folder / "train.py"), [], str(requirements))
    assert str(refused.value) == f"--requirements {requirements}, {message}"
    assert "s3cret" not in str(refused.value) and "pypi-AgE" not in str(refused.value)


def test_hashed_requirements_as_pip_compile_writes_them_pass_and_require_hashes_wants_a_hash_on_every_line(
    folder, tmp_path
):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(
        f"tk-extra==1.0 \\\n    --hash={DIGEST} \\\n    --hash {DIGEST}\n    # via -r requirements.in\n"
        f"tk-more==2.0 --hash={DIGEST}  # a comment\n"
    )
    workload = script_workload(job(), str(folder / "train.py"), [], str(requirements), require_hashes=True)
    assert workload.requirements == (
        f"tk-extra==1.0     --hash={DIGEST}     --hash {DIGEST}",
        f"tk-more==2.0 --hash={DIGEST}",
    )
    requirements.write_text(f"tk-extra==1.0 --hash={DIGEST}\ntk-more==2.0\n")
    with pytest.raises(SpecError) as refused:
        script_workload(job(), str(folder / "train.py"), [], str(requirements), require_hashes=True)
    assert str(refused.value) == (
        f"--require-hashes: --requirements {requirements}, line 2: 'tk-more==2.0' has no --hash; add one for each "
        "archive pip may pick (`pip hash FILE` prints it), or drop --require-hashes"
    )
    with pytest.raises(SpecError, match="give --requirements too"):
        script_workload(job(), str(folder / "train.py"), [], None, require_hashes=True)


def test_the_package_cache_is_the_users_own_and_one_another_user_could_write_is_refused(tmp_path, monkeypatch):
    """A shared temporary folder: anyone may create `trainkit-packages-<your uid>` there before you do."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cache = package_cache()
    assert cache == tmp_path / f"trainkit-packages-{os.getuid()}" and stat.S_IMODE(cache.stat().st_mode) == 0o700
    remedy = "remove it (or have its owner remove it), or set TMPDIR elsewhere"
    cache.chmod(0o777)
    with pytest.raises(SpecError) as refused:
        package_cache()
    assert str(refused.value) == (
        f"the package cache {cache} can be written by other users (mode 777): whoever can write there can plant what "
        f"trainkit runs; {remedy}"
    )
    cache.chmod(0o755)  # readable by others only: taken back
    assert package_cache() == cache and stat.S_IMODE(cache.stat().st_mode) == 0o700
    someone = os.getuid() + 1  # your cache's name under another uid: made by the real one, so not "yours"
    monkeypatch.setattr(os, "getuid", lambda: someone)
    (tmp_path / f"trainkit-packages-{someone}").mkdir(mode=0o700)
    with pytest.raises(SpecError, match=f"belongs to another user \\(uid {someone - 1}; you are {someone}\\)"):
        package_cache()
    monkeypatch.undo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "other"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / f"trainkit-packages-{os.getuid()}").symlink_to(cache)  # planted: a link to elsewhere
    with pytest.raises(SpecError, match="is not a folder"):
        package_cache()


def test_the_same_command_names_the_same_run_and_another_command_another(folder):
    script = str(folder / "train.py")
    first = run_id_for(script, ["--epochs", "3"])  # not the nodes nor the processes: a run continues at any size
    assert first == run_id_for(script, ["--epochs", "3"])
    assert first.startswith("train-") and first != run_id_for(script, ["--epochs", "4"])
    with pytest.raises(SpecError, match="--script FILE is required"):
        run_id_for(None, [])


def test_the_workload_starts_the_copied_script_and_survives_its_json(folder, tmp_path):
    spec = job(runs_dir=str(tmp_path / "runs"))
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("tk-extra==1.0  # a comment\n")
    workload = script_workload(spec, str(folder / "train.py"), ["--epochs", "2"], str(requirements), "wheels")
    digest = code_digest(read_code(folder))
    copied = str(spec.run_dir / "code" / digest / "train.py")
    assert workload.entry() == ["-m", "training.script", copied, "--epochs", "2"]  # through the script runner
    assert workload.requirements == ("tk-extra==1.0",) and workload.code == str(folder)
    assert Workload.from_json(workload.to_json()) == workload
    assert spec.run.workload == "script" and spec.to_dict()["derived"]["grad_accum_steps"] is None


def test_on_eks_the_code_rides_in_a_configmap_mounted_read_only_in_every_worker(folder):
    (folder / "weights.bin").write_bytes(b"\xff\x00\xfe")
    spec = job(target="eks", nodes=2, instance_type="p5.48xlarge", nproc=None)
    workload = script_workload(spec, str(folder / "train.py"), [])
    code = read_code(folder)
    name = submission.code_configmap_name(spec, "0a1b2c3d4e")
    manifest = render.render_pytorchjob(spec, "rdzv", workload, code, name)
    configmap = submission.render_code_configmap(spec, code, name)
    items = render.code_items(code)
    assert [item["path"] for item in items] == ["pkg/__init__.py", "train.py", "weights.bin"]
    binary = next(item["key"] for item in items if item["path"] == "weights.bin")
    assert base64.b64decode(configmap["binaryData"][binary]) == b"\xff\x00\xfe" and binary not in configmap["data"]
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == render.CODE_VOLUME)
    assert volume["configMap"] == {"name": configmap["metadata"]["name"], "items": items}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == render.CODE_VOLUME)
    assert mount == {"name": "code", "mountPath": render.CODE_MOUNT, "readOnly": True}
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert json.loads(env[WORKLOAD_ENV])["code"] == render.CODE_MOUNT  # where the pods read it
    assert "HF_TOKEN" in env  # a script may open gated hub files; optional, as for a random-init recipe


def test_a_step_report_lands_once_even_when_a_restart_redoes_steps(tmp_path, monkeypatch):
    """The first report of a process that redoes steps (resumed from an earlier checkpoint) drops their lines."""
    import training.script as contract

    spec = job(runs_dir=str(tmp_path), metrics_port=0)
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps(spec.to_dict()))
    monkeypatch.setenv("TRAINKIT_RUN_DIR", str(run_dir))
    monkeypatch.setattr(contract, "_sink", None)
    for step in range(1, 6):
        contract.report_step(step, loss=1.0 / step)
    monkeypatch.setattr(contract, "_sink", None)  # a restarted process, resumed from step 3
    for step in range(4, 7):
        contract.report_step(step, loss=0.5, samples_per_s=10.0)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6] and records[-1]["samples_per_s"] == 10.0
    assert contract.checkpoint_dir() == run_dir / "checkpoints" and os.path.isdir(run_dir / "checkpoints")


@pytest.mark.parametrize(
    "line",
    [
        "tk-extra @ git+ssh://git@github.com/org/tk-extra.git",  # ssh's `git` user is no secret
        "tk-extra @ https://${PKG_TOKEN}@pkgs.example/tk_extra-1.0-py3-none-any.whl",  # pip expands it on the node
        "tk-extra @ https://${PKG_USER}:${PKG_TOKEN}@pkgs.example/tk_extra-1.0-py3-none-any.whl",
    ],
)
def test_a_url_whose_user_part_holds_no_secret_is_accepted(line):
    from trainkit.workloads.packages import refusal

    assert refusal(line, "line 1") is None
    assert refusal(line.replace("${PKG_TOKEN}", "pypi-AgE").replace("git@", "git:s3cret@"), "line 1")
