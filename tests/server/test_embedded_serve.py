"""`tito serve --engine embedded`: a real model behind the gateway, through the openai SDK."""

from __future__ import annotations

import anthropic
import httpx
import numpy as np
import openai
import pytest
from helpers.support import start_tito

from tito.samples import decode_samples

pytestmark = pytest.mark.slow  # loads the embedded model

pytest.importorskip("torch")
pytest.importorskip("tito.engines.embedded")


def test_embedded_serve_two_turns_exact_sample() -> None:
    gateway = start_tito("serve", "--port", "0", timeout=180)  # embedded is the default
    try:
        health = httpx.get(gateway.url + "/health").json()
        assert health["engine"]["name"] == "embedded" and health["family"] == "chatml"
        assert health["capabilities"]["append_only_verified"] is True
        assert httpx.get(gateway.url + "/metrics").status_code == 200
        sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
        client = openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="x",
                               max_retries=0)
        messages = [{"role": "user", "content": "What is 2+3? Answer with a number."}]
        first = client.chat.completions.create(model="m", messages=messages, max_tokens=12,
                                               temperature=0)
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "Are you sure?"}]
        second = client.chat.completions.create(model="m", messages=messages, max_tokens=12,
                                                temperature=0)
        assert second.usage.prompt_tokens > first.usage.prompt_tokens + \
            first.usage.completion_tokens
        info = httpx.get(f"{gateway.url}/sessions/{sid}?include_ids=true").json()
        r0, r1 = info["records"]
        assert r1["prompt_len"] == r0["prompt_len"] + r0["output_len"] + r1["bridge_len"]
        resp = httpx.post(f"{gateway.url}/sessions/{sid}/samples", json={})
        sample = decode_samples(resp.content).samples[0]
        expected = r0["bridge_ids"] + r0["output_ids"] + r1["bridge_ids"] + r1["output_ids"]
        assert sample.tokens.tolist() == expected
        mask = [1] * r0["output_len"] + [0] * r1["bridge_len"] + [1] * r1["output_len"]
        assert sample.loss_mask.tolist() == mask[: sample.response_length]
        assert np.array_equal(sample.rollout_log_probs[: r0["output_len"]],
                              np.asarray(r0["logprobs"], dtype=np.float32))

        # streamed from the embedded engine: several deltas, the same text and record
        again = httpx.post(gateway.url + "/sessions").json()["session_id"]
        stream_client = openai.OpenAI(base_url=f"{gateway.url}/sessions/{again}/v1",
                                      api_key="x", max_retries=0)
        chunks = list(stream_client.chat.completions.create(
            model="m", messages=messages[:1], max_tokens=12, temperature=0, stream=True))
        texts = [c.choices[0].delta.content for c in chunks if c.choices and
                 c.choices[0].delta.content]
        assert len(texts) > 1 and "".join(texts) == first.choices[0].message.content
        streamed = httpx.get(f"{gateway.url}/sessions/{again}?include_ids=true").json()
        assert streamed["records"][0]["output_ids"] == r0["output_ids"]

        # the other two APIs over the same model, streamed: the same first answer
        question = messages[0]["content"]
        sid3 = httpx.post(gateway.url + "/sessions").json()["session_id"]
        claude = anthropic.Anthropic(base_url=f"{gateway.url}/sessions/{sid3}",
                                     api_key="x", max_retries=0)
        with claude.messages.stream(  # this SDK has no temperature argument: extra_body
                model="m", max_tokens=12, extra_body={"temperature": 0},
                messages=[{"role": "user", "content": question}]) as events:
            text = "".join(events.text_stream)
        assert text == first.choices[0].message.content
        sid4 = httpx.post(gateway.url + "/sessions").json()["session_id"]
        responses = openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid4}/v1", api_key="x",
                                  max_retries=0)
        with responses.responses.stream(model="m", input=question, max_output_tokens=12,
                                        temperature=0) as events:
            final = events.get_final_response()
        assert final.output_text == first.choices[0].message.content
    finally:
        gateway.stop()
