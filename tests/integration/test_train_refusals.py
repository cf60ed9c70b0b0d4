"""`invoke train` refusing input before any training process starts: exit code 2, the reason, nothing run."""

from __future__ import annotations

import json

from tests.helpers.product import invoke, tiny_args


def test_a_bad_record_is_refused_by_line_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"prompt": "p", "response": "r"})
    bad.write_text(f"{good}\n\n{good}\n" + '{"text": "no prompt or response here"}\n' + f"{good}\n")
    runs = tmp_path / "runs"
    result = invoke(*tiny_args(runs, "--dataset", str(bad), "--steps", "2"))
    assert result.returncode == 2, result.stdout + result.stderr
    said = f"--dataset {bad}: {bad}:4: record has fields ['text'], which is text, and the records before it are "
    assert said + f"prompt-response (from {bad}:1)" in result.stderr
    assert not runs.exists() or not any(runs.iterdir())
    cases = (
        ("[1, 2]\n", f"{bad}:1: expected a JSON object, found list"),
        (f"{good}\n{{oops\n", f"{bad}:2: Expecting property name"),
        ("\n\n", "holds no records"),
    )
    for text, said in cases:
        bad.write_text(text)
        result = invoke(*tiny_args(runs, "--dataset", str(bad), "--steps", "2"))
        assert result.returncode == 2 and said in result.stderr, result.stderr


def test_hybrid_shard_on_one_node_is_rejected_before_anything_starts(tmp_path):
    result = invoke(*tiny_args(tmp_path, "--sharding", "HYBRID_SHARD"))
    assert result.returncode == 2 and "needs --nodes >= 2" in result.stderr
    assert not any(tmp_path.iterdir())
