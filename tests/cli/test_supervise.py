"""The supervisor of ``tito serve --workers N``: the workers' arguments and environment
(the process side, restarts included, is in test_serve_workers.py)."""

from __future__ import annotations

from tito.cli.supervise import without_api_key, worker_argv, worker_env
from tito.config import ServerConfig


def test_the_api_key_never_reaches_a_workers_argv() -> None:
    for given in (["serve", "--api-key", "K1", "--port", "9000"],
                  ["serve", "--api-key=K1", "--port", "9000"],
                  ["serve", "--api-k", "K1", "--port", "9000"],  # argparse's abbreviation
                  ["serve", "--api=K1", "--port", "9000"],
                  ["serve", "--ap", "K1", "--port", "9000"]):
        assert without_api_key(given) == ["serve", "--port", "9000"], given
    kept = ["serve", "--allowed-hosts", "a,b", "--access-log", "--served-model-name", "k"]
    assert without_api_key(kept) == kept


def test_a_worker_gets_its_port_and_index_and_the_key_in_its_environment() -> None:
    config = ServerConfig(tokenizer="t", engine="sglang", engine_url="http://e:1",
                          port=9000, workers=3, api_key="K1")
    argv = worker_argv(["serve", "--api-key", "K1", "--port", "9000", "--workers", "3"],
                       config, 2)
    assert argv == ["serve", "--port", "9000", "--workers", "3", "--port", "9002",
                    "--worker-index", "2"]
    assert worker_env(config) == {"TITO_API_KEY": "K1"}
    assert worker_env(ServerConfig(tokenizer="t", engine="sglang", engine_url="http://e:1",
                                   port=9000, workers=3)) == {}
