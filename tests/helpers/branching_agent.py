"""An agent that branches (for ``tito rollout --session-version v2`` tests): a retry of
its second turn, then a return to the first turn with another question. Its v2 tree:
0 ← 1, 0 ← 2 ← 3, 0 ← 4; leaf 1 is a superseded retry, leaves 3 and 4 are kept."""

from __future__ import annotations

from typing import Any

import openai


async def run_agent(base_url: str, prompt: list[dict[str, Any]],
                    request_kwargs: dict[str, Any], metadata: dict[str, Any],
                    **_: Any) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    async with client:
        async def say(messages: list[Any]) -> dict[str, Any]:
            r = await client.chat.completions.create(model="m", messages=messages,
                                                     **request_kwargs)
            return {"role": "assistant", "content": r.choices[0].message.content}

        u0 = {"role": "user", "content": prompt[-1]["content"] + "\nSAY Let me think."}
        a0 = await say([u0])
        u1 = {"role": "user", "content": "Step two?\nSAY Two."}
        await say([u0, a0, u1])
        a2 = await say([u0, a0, u1])  # the retry
        await say([u0, a0, u1, a2, {"role": "user", "content": "Done?\nSAY Done."}])
        await say([u0, a0, {"role": "user", "content": "Another idea?\nSAY Maybe."}])
    return {"reward": 1.0, "branches": 2}
