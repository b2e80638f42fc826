"""``tito rollout --ray`` on a real local Ray cluster (three nodes, one machine).

The cluster is Ray's own (``ray.cluster_utils.Cluster``: a head and two worker nodes, each
a raylet of its own), every node on 127.0.0.1: nothing listens on the machine's own
address. ``tito rollout`` runs as a subprocess that joins it, starts a gateway
and a runner per node (the gateways in front of one shared mock engine) and runs the
scripted agent. One test removes a worker node mid-run: its trajectories must run again on
the other nodes, and every trajectory must be written exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from helpers.support import REPO, engine_log, start_mock, tokenizer_dir

from tito.cluster import RAY_LOOPBACK_ENV

# before Ray is imported: the nodes started on 127.0.0.1 stay there (Ray swaps it for the
# machine's address otherwise); the `tito rollout` subprocesses inherit it
os.environ.setdefault(RAY_LOOPBACK_ENV, "0")
ray = pytest.importorskip("ray", reason="needs Ray (pip install 'tito-gateway[ray]')")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "RAY_USAGE_STATS_ENABLED": "0"}
SCRIPTED = "tito.examples.scripted_agent:run_agent"


LOOPBACK = "127.0.0.1"
NODE = {"num_cpus": 1, "node_ip_address": LOOPBACK}
"""Every test node: one CPU, on loopback."""


def on_loopback(cluster: Cluster) -> None:
    assert cluster.address.startswith(f"{LOOPBACK}:"), cluster.address
    nodes = cluster.list_all_nodes()
    assert nodes and {node.node_ip_address for node in nodes} == {LOOPBACK}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        for _ in range(2):
            c.add_node(**NODE)
        c.wait_for_nodes()
        on_loopback(c)
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def slow_mock() -> Iterator[str]:
    """One mock engine for every node's gateway; 15 ms a token, so trajectories last."""
    proc = start_mock(tokenizer_dir("qwen3"), "qwen3", "--token-latency-ms", "15")
    yield proc.url
    proc.stop()


def ray_rollout(address: str, engine_url: str, out: Path, *extra: str
                ) -> subprocess.Popen[str]:
    args = ["--ray", address, "--engine", "sglang", "--engine-url", engine_url,
            "--tokenizer", str(tokenizer_dir("qwen3")), "--family", "qwen3",
            "--agent", SCRIPTED, "--out", str(out), *extra]
    return subprocess.Popen([sys.executable, "-m", "tito.cli", "rollout", *args], cwd=REPO,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def written(out: Path) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    summary = json.loads((out / "summary.json").read_text())
    table = pq.read_table(out / "samples.parquet", columns=["prompt_index", "sample_index"])
    keys = list(zip(table.column("prompt_index").to_pylist(),
                    table.column("sample_index").to_pylist(), strict=True))
    return summary, keys


def test_trajectories_run_on_every_node(cluster: Cluster, slow_mock: str,
                                        tmp_path: Path) -> None:
    before = len(engine_log(slow_mock))
    code, text = finish(ray_rollout(cluster.address, slow_mock, tmp_path, "--limit", "4",
                                    "--n-per-prompt", "3", "--concurrency", "6",
                                    "--max-new-tokens", "8"))
    assert code == 0, text
    assert f"3 node(s), a gateway per node (on {LOOPBACK})" in text  # the nodes' address
    summary, keys = written(tmp_path)
    assert summary["finished"] == 12 and summary["tito_violations"] == 0
    assert summary["requeued_trajectories"] == 0
    assert summary["config"]["ray"] == cluster.address
    assert sorted(keys) == [(p, k) for p in range(4) for k in range(3)]
    # the sessions went through three gateways (one per node): three session-id spaces
    rids = {e["rid"][:32] for e in engine_log(slow_mock)[before:]}
    assert len(rids) == 12


def test_a_node_dying_mid_run_requeues_and_never_duplicates(cluster: Cluster, slow_mock: str,
                                                            tmp_path: Path) -> None:
    before = len(engine_log(slow_mock))
    proc = ray_rollout(cluster.address, slow_mock, tmp_path, "--limit", "6",
                       "--n-per-prompt", "3", "--concurrency", "6",
                       "--max-new-tokens", "24")
    deadline = time.monotonic() + 120
    while len(engine_log(slow_mock)) - before < 8:  # every node has turns in flight
        assert proc.poll() is None, finish(proc)[1]
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.2)
    victim = cluster.list_all_nodes()[-1]
    assert not victim.head
    cluster.remove_node(victim)
    code, text = finish(proc)
    assert code == 0, text
    summary, keys = written(tmp_path)
    assert summary["requeued_trajectories"] >= 1, text
    assert "node(s) lost" in text
    assert summary["finished"] == 18 and summary["failed"] == 0
    assert summary["tito_violations"] == 0 and summary["strict_mismatches"] == 0
    assert sorted(keys) == [(p, k) for p in range(6) for k in range(3)]  # each once
    cluster.add_node(**NODE)  # back to three nodes for any later test
    cluster.wait_for_nodes()
    on_loopback(cluster)


def test_external_gateways_by_url(cluster: Cluster, slow_mock: str, tmp_path: Path) -> None:
    from helpers.support import start_gateway

    gateway = start_gateway(slow_mock, tokenizer_dir("qwen3"), "qwen3")
    try:
        args = ["--ray", cluster.address, "--gateway", gateway.url, "--agent", SCRIPTED,
                "--out", str(tmp_path), "--limit", "3", "--max-new-tokens", "8"]
        proc = subprocess.Popen([sys.executable, "-m", "tito.cli", "rollout", *args],
                                cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        code, text = finish(proc)
    finally:
        gateway.stop()
    assert code == 0, text
    assert "external gateways" in text
    summary, keys = written(tmp_path)
    assert summary["finished"] == 3 and sorted(keys) == [(0, 0), (1, 0), (2, 0)]


def test_a_local_cluster_stays_on_loopback(tmp_path: Path) -> None:
    """``--ray local`` starts its one-node cluster (and so its gateway) on 127.0.0.1."""
    args = ["--ray", "local", "--engine", "mock", "--tokenizer", str(tokenizer_dir("qwen3")),
            "--family", "qwen3", "--agent", SCRIPTED, "--out", str(tmp_path),
            "--limit", "1", "--max-new-tokens", "8"]
    proc = subprocess.run([sys.executable, "-m", "tito.cli", "rollout", *args], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert f"Ray cluster local: 1 node(s), a gateway per node (on {LOOPBACK})" in text
    summary, keys = written(tmp_path)
    assert summary["finished"] == 1 and keys == [(0, 0)]


def test_unreachable_cluster_is_a_clear_failure(tmp_path: Path) -> None:
    args = ["--ray", "127.0.0.1:1", "--engine", "mock", "--tokenizer",
            str(tokenizer_dir("qwen3")), "--family", "qwen3", "--out", str(tmp_path / "o")]
    proc = subprocess.run([sys.executable, "-m", "tito.cli", "rollout", *args], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    assert "cannot join the Ray cluster at '127.0.0.1:1'" in proc.stderr
    assert not (tmp_path / "o" / "samples.parquet").exists()
