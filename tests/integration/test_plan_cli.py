"""`invoke plan` through the real command line: the table, the JSON, and a refused flag."""

from __future__ import annotations

import datetime
import json
import re

from PIL import Image

from tests.helpers.pricing_standin import PricingStandIn
from tests.helpers.product import invoke
from tests.helpers.published import N7
from tests.helpers.tiny_decoders import tiny_config, write_tiny
from training.registry import REGISTRY, DecoderArch
from trainkit.plan.prices import OFFLINE_ENV, table


def test_invoke_plan_prints_the_table_and_json(tmp_path):
    job = ("--model", "llama2-70b", "--nodes", "16", "--gpus-per-node", "8")
    # No credentials anywhere (none in the environment, HOME or an instance-metadata endpoint): the launcher asks none.
    offline = {"TRAINKIT_STATE_DIR": str(tmp_path / "offline"), "HOME": str(tmp_path), OFFLINE_ENV: "api"}
    offline["AWS_EC2_METADATA_DISABLED"] = "true"
    text = invoke("plan", *job, env=offline, drop_env_prefix="AWS_")
    assert text.returncode == 0, text.stderr
    assert "68,976,648,192" in text.stdout and "*FULL_SHARD" in text.stdout and "$ per hour" in text.stdout
    # Issue 55. Without credentials: the shipped table's price, with its date (after AWS's June 2025 reduction).
    dated = table()["as_of"]
    assert dated > "2025-06" and f"cost on eks (table of {dated}; at the compute rate)" in text.stdout
    assert f"{16 * table()['ec2_hour']['p5.48xlarge']:,.2f} (16 x p5.48xlarge at $" in text.stdout
    assert "capacity block    Capacity Block offerings need AWS credentials" in text.stdout
    # With credentials, the Price List API's price (the stand-in's: botocore's model checks every request), dated
    # today; EKS's and SageMaker's instance prices differ; the EKS plan shows the Capacity Block offering.
    with PricingStandIn() as aws:
        env = {**aws.env(), "TRAINKIT_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}
        eks = invoke("plan", *job, "--target", "eks", env=env, drop_env_prefix="AWS_")
        sagemaker = invoke("plan", *job, "--target", "sagemaker", "--spot", env=env, drop_env_prefix="AWS_")
        refresh = ("infra.prices", "--refresh-table", "--output", str(tmp_path / "prices.json"))
        refreshed = invoke(*refresh, env=env, drop_env_prefix="AWS_")
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    assert eks.returncode == 0 and sagemaker.returncode == 0, eks.stderr + sagemaker.stderr
    assert f"cost on eks (price list API, {today}; at the compute rate)" in eks.stdout
    assert "$ per hour        819.68 (16 x p5.48xlarge at $51.23)" in eks.stdout  # the stand-in's EC2 Linux price
    assert f"0.100  EKS control plane (1 cluster) (price list API, {today})" in eks.stdout
    assert "0.048  NAT gateway" in eks.stdout
    assert (
        f"0.674  FSx for Lustre (2,400 GiB Persistent-2 at 250 MB/s/TiB, $0.205/GB-month) (price list API, {today})"
        in eks.stdout
    )
    block = re.search(
        r"capacity block    16 x p5\.48xlarge for 24 h from (\S+) \(us-east-1b\): \$([\d,.]+) upfront", eks.stdout
    )
    assert block and float(block[2].replace(",", "")) == round(31.464 * 16 * 24, 2), eks.stdout  # the cheaper one
    assert "$ per hour        957.92 (16 x ml.p5.48xlarge at $59.87)" in sagemaker.stdout  # SageMaker's training price
    assert "EKS control plane" in sagemaker.stdout and "capacity block" not in sagemaker.stdout  # the stack's, still
    assert "no discount is guessed here" in sagemaker.stdout and "ml.p5.48xlarge at $59.87" in sagemaker.stdout
    asked = [params for operation, params in aws.requests if operation == "GetProducts"]
    assert len(asked) == 5 + 5, asked  # EC2, EKS, NAT, FSx; SageMaker (the rest: the day's cache); then the refresh's
    # p4d prices and three FSx tiers
    # The maintainer's refresh of the shipped table: every row as the API prices it, dated today.
    assert refreshed.returncode == 0, refreshed.stderr
    written = json.loads((tmp_path / "prices.json").read_text())
    assert written["as_of"] == today and written["ec2_hour"] == {"p4d.24xlarge": 20.11, "p5.48xlarge": 51.23}
    assert written["sagemaker_training_hour"] == {"ml.p4d.24xlarge": 23.42, "ml.p5.48xlarge": 59.87}
    assert (written["eks_cluster_hour"], written["nat_gateway_hour"]) == (0.1, 0.048)
    assert written["fsx_lustre_persistent_2_gb_month"] == {"125": 0.15, "250": 0.205, "500": 0.335, "1000": 0.59}
    data = json.loads(invoke("plan", "--model", "llama2-7b", "--json").stdout)
    assert data["param_count"] == N7 and data["memory_per_gpu"]["FULL_SHARD"]["total"] > 0


def test_invoke_plan_rejects_a_bad_boolean():
    result = invoke("plan", "--activation-checkpointing", "maybe")
    assert result.returncode == 2 and "--activation-checkpointing must be true or false" in result.stderr


def test_invoke_plan_scaling_writes_the_table_png_and_json(tmp_path):
    result = invoke(
        "plan", "--model", "llama2-13b", "--instance-type", "p4d.24xlarge", "--scaling", "--output", str(tmp_path / "s")
    )
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip().split(" ")[0].isdigit()]
    assert [int(row[0]) for row in rows] == [1, 2, 4, 8, 16, 32, 64]
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["instance_type"] == "p4d.24xlarge" and set(data["curves"]) == {
        "FULL_SHARD",
        "HYBRID_SHARD",
        "SHARD_GRAD_OP",
        "NO_SHARD",
    }
    for n, chosen in data["chosen"].items():  # the chosen strategy fits and is the fastest of those that fit
        fitting = {name: curve for name, curve in data["curves"].items() if data["fits"][name][n]}
        steps = {name: next(p["step_s"] for p in curve if p["nodes"] == int(n)) for name, curve in fitting.items()}
        assert chosen == (min(steps, key=steps.get) if steps else None)
    with Image.open(tmp_path / "s.png") as image:
        assert image.format == "PNG" and image.width >= 1000


def test_invoke_plan_published_prints_each_table_beside_the_model():
    result = invoke("plan", "--published")
    assert result.returncode == 0, result.stderr
    for name in ("nccl-allreduce-2xp5", "bert-large-dl1", "bert-1.5b-dl1", "mlp-sagemaker-p3", "llama2-fsdp-p5"):
        assert name in result.stdout
    assert "+15.9%" in result.stdout and "pt" in result.stdout
    # the DL1 BERT 1.5B anchor, then the same job predicted on p4d and p5
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] and "xlarge" in line.split()[0]]
    assert [(row[0], row[1], row[-1]) for row in rows] == [
        *(("dl1.24xlarge", n, "published") for n in ("1", "8", "16")),
        *((kind, n, "predicted") for kind in ("p4d.24xlarge", "p5.48xlarge") for n in ("1", "8", "16")),
    ]
    assert rows[0][2:4] == ["276.7", "100.0%"] and rows[2][3] == "82.7%"


def test_invoke_plan_sizes_zero1s_optimizer_share_from_the_registry_entry():
    n = REGISTRY["bert-1.5b"].arch.parameters()
    result = invoke("plan", "--model", "bert-1.5b", "--nodes", "16", "--sharding", "ZERO_1", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["param_count"] == n and data["world_size"] == 128
    assert data["memory_per_gpu"]["ZERO_1"]["optimizer"] == 12 * n / 128
    assert data["communication"]["exposed_s"] == data["communication"]["communication_s"] > 0
    text = invoke("plan", "--model", "bert-1.5b", "--nodes", "16", "--sharding", "ZERO_1").stdout
    assert "*ZERO_1" in text and "over the 128 ranks" in text and "tokens/s" in text and "$ per epoch" in text
    compared = invoke("plan", "--model", "bert-1.5b", "--nodes", "16", "--sharding", "NO_SHARD")
    assert compared.returncode == 0 and "*NO_SHARD" in compared.stdout and "  ZERO_1 " in compared.stdout
    refused = invoke("plan", "--model", "llama2-7b", "--sharding", "ZERO_1")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--sharding ZERO_1: DeepSpeed ZeRO-1 is BERT's; llama2-7b shards with FSDP2" in refused.stderr


def test_invoke_plan_sizes_a_model_folder_from_its_config(tmp_path):
    """A Hugging Face model folder is planned from its config.json (Qwen2's biases and tied embeddings counted);
    a mixture-of-experts one is refused with what is missing."""
    folder = write_tiny(tmp_path / "tiny-qwen2", "qwen2")
    result = invoke("plan", "--model", str(folder), "--nodes", "2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # 2 layers x (q, o 64x64; k, v 64x32; their 128 biases; MLP 3 x 64x160; 2 norms) + one 320x64 embedding + norm
    assert data["param_count"] == DecoderArch.from_config(tiny_config("qwen2")).parameters() == 107_072
    assert data["world_size"] == 16 and data["memory_per_gpu"]["FULL_SHARD"]["total"] > 0
    text = invoke("plan", "--model", str(folder), "--layers", "1").stdout
    assert f"Plan: {folder} (truncated to 1 layers)" in text and "*FULL_SHARD" in text
    (folder / "config.json").write_text(json.dumps({"model_type": "mixtral", "num_local_experts": 8}))
    refused = invoke("plan", "--model", str(folder))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "model_type 'mixtral': a mixture-of-experts model (num_local_experts=8)" in refused.stderr
