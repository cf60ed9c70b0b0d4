"""`invoke plan` through the real command line: the table, the JSON, and a refused flag."""

from __future__ import annotations

import json

from tests.helpers.product import invoke
from tests.helpers.published import N7


def test_invoke_plan_prints_the_table_and_json():
    text = invoke("plan", "--model", "llama2-70b", "--nodes", "16", "--gpus-per-node", "8")
    assert text.returncode == 0, text.stderr
    assert "68,976,648,192" in text.stdout and "*FULL_SHARD" in text.stdout and "$ per hour" in text.stdout
    data = json.loads(invoke("plan", "--model", "llama2-7b", "--json").stdout)
    assert data["param_count"] == N7 and data["memory_per_gpu"]["FULL_SHARD"]["total"] > 0


def test_invoke_plan_rejects_a_bad_boolean():
    result = invoke("plan", "--activation-checkpointing", "maybe")
    assert result.returncode == 2 and "--activation-checkpointing must be true or false" in result.stderr
