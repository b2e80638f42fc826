"""mini-swe-agent against the gateway: its ``DefaultAgent`` loop with the agent and
environment settings of its default config (``mini.yaml``, without the interactive
``mode``) and a ``LitellmModel`` (``openai/<name>``, ``api_base`` the session URL): litellm
speaks Chat Completions with the ``bash`` tool.

Its ``LocalEnvironment`` runs the model's commands in a temporary folder; they are only
``echo``. Each command prints the next directive, so the run is: a reasoning turn that
runs a command, a second command, then ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``,
which ends the run (three model calls). The model keeps litellm's default observation
template (mini.yaml's JSON one escapes the newlines the mock's directives need).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from helpers.harness import DUMMY_KEY, MODEL, HarnessStack, Trajectory, cells

pytest.importorskip("minisweagent")
import litellm
import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

pytestmark = pytest.mark.slow
litellm.telemetry = False
litellm.suppress_debug_info = True
litellm.callbacks = []

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def call(command: str) -> str:
    """The directive of a reply that runs ``command`` with the ``bash`` tool."""
    return "CALL bash " + json.dumps({"command": command})


def task() -> str:
    """The task: think, run a command that prints the call of a command that prints the
    submit call. It starts on a new line: mini.yaml puts it after 'Please solve this
    issue: ', and a directive must start its line."""
    second = call("echo " + shlex.quote(call(SUBMIT)))
    return ("\nTHINK I should run a command first.\n"
            + call("echo step one && echo " + shlex.quote(second)))


def run_mini_swe_agent(traj: Trajectory, variant: str, workdir: Path) -> int:
    """The run; returns the model calls the agent counted."""
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    agent_config = {k: v for k, v in config["agent"].items() if k != "mode"}
    model = LitellmModel(model_name=f"openai/{MODEL}", cost_tracking="ignore_errors",
                         model_kwargs={"api_base": traj.openai_base_url,
                                       "api_key": DUMMY_KEY, "num_retries": 0})
    env = LocalEnvironment(cwd=str(workdir), timeout=10, **config["environment"])
    agent = DefaultAgent(model, env, **agent_config)
    result = agent.run(task())
    assert result["exit_status"] == "Submitted", result
    return agent.n_calls


@pytest.mark.parametrize(("variant", "version"), cells({}, ("default",)))
def test_every_call_is_in_the_samples(harness: HarnessStack, variant: str, version: str,
                                      tmp_path: Path) -> None:
    traj = Trajectory(harness, version)
    traj.check(run_mini_swe_agent(traj, variant, tmp_path))
