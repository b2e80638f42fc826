"""The configuration rules (design §9): one case per rule — the flags that break it, and a
message that names the flags and the fix. A rule without a case fails the suite."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tito.config import RULES, ServerConfig
from tito.types.errors import ConfigError

OK = {"tokenizer": "tok", "engine": "sglang", "engine_url": "http://x"}

CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "session_version": ({"session_version": "v3"}, ["--session-version 'v3'", "v1", "v2"]),
    "partial_rollout": ({"partial_rollout": True}, ["--partial-rollout", "not supported",
                                                    "drop --partial-rollout"]),
    "v2_only_flags": ({"max_nodes": 8}, ["--max-nodes is a v2 option",
                                         "--session-version v2"]),
    "v1_only_flags": ({"session_version": "v2", "max_rollback": 2},
                      ["--max-rollback is a v1 option", "drop --max-rollback"]),
    "max_rollback": ({"max_rollback": -1}, ["--max-rollback must be >= 0"]),
    "max_nodes": ({"session_version": "v2", "max_nodes": 0}, ["--max-nodes must be"]),
    "custom_template": ({"family": "qwen3", "chat_template": "t.jinja"},
                        ["--chat-template", "--family default", "--family qwen3"]),
    "custom_stop_token": ({"family": "qwen3", "stop_token": "<|im_end|>"},
                          ["--stop-token", "--family default", "--family qwen3"]),
    "engine": ({"engine": "tgi", "engine_url": None}, ["unknown engine 'tgi'"]),
    "engine_url_needed": ({"engine_url": None}, ["--engine sglang needs --engine-url"]),
    "engine_url_unused": ({"engine": "mock"}, ["--engine-url is only used with"]),
    "engine_url_kind": ({"engine_url": "tgi+http://x"}, ["sglang+URL or vllm+URL"]),
    "engine_urls_unique": ({"extra_engine_urls": ("http://x",)},
                           ["--engine-url names the same engine twice"]),
    "workers": ({"workers": 0}, ["--workers must be in [1, 256]"]),
    "workers_port": ({"workers": 2, "port": 0}, ["--workers N listens on N consecutive",
                                                 "give a --port"]),
    "workers_engine": ({"workers": 2, "port": 9000, "engine": "embedded", "engine_url": None,
                        "tokenizer": ""}, ["--workers", "embedded engine would load"]),
    "engine_max_inflight": ({"engine_max_inflight": 0},
                            ["--engine-max-inflight must be at least 1"]),
    "tokenizer_needed": ({"tokenizer": ""}, ["--tokenizer is required with --engine sglang"]),
    "tokenizer_unused": ({"engine": "embedded", "engine_url": None},
                         ["--tokenizer is not used with --engine embedded"]),
    "allowed_origins": ({"allowed_origins": ("http://localhost:3000", "localhost:3000")},
                        ["--allowed-origins 'localhost:3000' is not an origin",
                         "scheme://host[:port]"]),
    "pause_mode": ({"pause_generation_mode": "freeze"},
                   ["--pause-generation-mode 'freeze'", "retract, abort, in_place"]),
    "compat": ({"compat": "slime"}, ["--compat 'slime'", "none, miles"]),
    "weight_versions_format": ({"weight_versions_format": "strings"},
                               ["--weight-versions-format 'strings'", "versions or spans"]),
    "hosted_tools": ({"hosted_tools": "ignore"}, ["--hosted-tools 'ignore'", "drop, error"]),
    "images": ({"images": "drop"}, ["--images 'drop'", "reject, placeholder"]),
    "side_requests": ({"side_requests": "train"}, ["--side-requests 'train'", "drop, keep"]),
    "after_length_cut": ({"after_length_cut": "drop"},
                         ["--after-length-cut 'drop'", "keep, refuse"]),
    "routing_replay_engine": ({"engine": "embedded", "engine_url": None, "tokenizer": "",
                               "routing_replay": True}, ["--routing-replay", "embedded"]),
    "indexer_replay_engine": ({"engine": "embedded", "engine_url": None, "tokenizer": "",
                               "indexer_replay": True}, ["--indexer-replay", "embedded"]),
    "sampling_mask_engine": ({"engine": "vllm", "sampling_mask_replay": True},
                             ["--sampling-mask-replay", "/inference/v1/generate"]),
    "routing_layers_unused": ({"routing_layers": 4}, ["--routing-layers is only used with "
                                                      "--routing-replay"]),
    "routing_layers": ({"routing_replay": True, "routing_layers": 0,
                        "pause_generation_mode": "in_place"}, ["--routing-layers must be"]),
    "lora_engine": ({"engine": "embedded", "engine_url": None, "tokenizer": "",
                     "lora_name": "a"}, ["--lora-name", "--engine sglang"]),
    "max_seq_len": ({"max_seq_len": 1}, ["--max-seq-len must be at least 2"]),
    "max_prompt_tokens": ({"max_prompt_tokens": 0}, ["--max-prompt-tokens must be"]),
    "max_json_depth": ({"max_json_depth": 2}, ["--max-json-depth must be in [4, 512]"]),
    "default_max_tokens": ({"default_max_tokens": 0}, ["--default-max-tokens must be"]),
    "stream_interval": ({"stream_interval": 0}, ["--stream-interval must be at least 1"]),
    "keepalive_timeout": ({"keepalive_timeout": 0.0}, ["--keepalive-timeout must be above 0"]),
    "routing_replay_retract": ({"routing_replay": True, "indexer_replay": True},
                               ["--routing-replay and --indexer-replay",
                                "--pause-generation-mode retract",
                                "grow with every turn", "in_place or abort"]),
}


def test_every_rule_has_a_case() -> None:
    assert sorted(CASES) == sorted(rule.name for rule in RULES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule(name: str, caplog: pytest.LogCaptureFixture) -> None:
    changes, words = CASES[name]
    config = ServerConfig(**{**OK, **changes})
    rule = next(r for r in RULES if r.name == name)
    assert rule.broken(config)
    if rule.level == "error":
        with pytest.raises(ConfigError) as err:
            config.validate()
        message = err.value.message
    else:
        with caplog.at_level(logging.WARNING, logger="tito.config"):
            warnings = config.validate()
        [message] = warnings
        assert message in caplog.text
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_partial_rollout_is_refused_for_every_session_version(version: str) -> None:
    with pytest.raises(ConfigError, match="--partial-rollout is not supported with sessions"):
        ServerConfig(**OK, session_version=version, partial_rollout=True).validate()


def test_a_valid_config_has_no_warnings() -> None:
    assert ServerConfig(**OK).validate() == []
    assert ServerConfig(**OK, routing_replay=True,
                        pause_generation_mode="in_place").validate() == []
