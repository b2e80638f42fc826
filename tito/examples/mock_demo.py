"""Demo: a 3-turn tool-calling agent through `tito serve` + `tito mock-engine`.

Run ``python -m tito.examples.mock_demo --tokenizer DIR --family qwen3``. The stack
builder (:func:`tito.stack.start_stack`) starts ``tito mock-engine`` as a child process and
serves the gateway in this process, on free ports; an OpenAI-SDK agent whose messages
script the mock model (``CALL``/``SAY``/``THINK`` directives) runs through it, and the
training sample is printed with the generated (loss-mask 1) spans highlighted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionToolParam
from rich.console import Console
from rich.text import Text

from tito.client.agent import generate
from tito.client.tracer import SessionTracer
from tito.config import ServerConfig
from tito.examples.calculator_agent import sdk_messages
from tito.samples import Sample
from tito.stack import start_stack
from tito.types.tokenizer import Tokenizer

TOOLS: list[ChatCompletionToolParam] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


async def weather_agent(base_url: str, prompt: list[dict[str, Any]],
                        request_kwargs: dict[str, Any], metadata: dict[str, Any],
                        **_: Any) -> dict[str, Any]:
    """Turn 1 calls the tool, turn 2 calls it twice in parallel, turn 3 answers."""
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    messages = list(prompt)
    results = iter([
        'CALL get_weather {"city": "Tokyo"}\nCALL get_weather {"city": "Oslo"}',
        "THINK Both are known now.\nSAY Paris 21°C, Tokyo 18°C, Oslo 9°C.",
        "",
    ])
    turns = 0
    while True:
        reply = await client.chat.completions.create(
            model="demo", messages=sdk_messages(messages), tools=TOOLS, **request_kwargs)
        turns += 1
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content":
                             next(results) if call is message.tool_calls[-1] else "ok"})
    await client.close()
    return {"reward": 1.0, "turns": turns}


def show(sample: Sample, tok: Tokenizer) -> None:
    console = Console()
    prompt_len = sample.prompt_length
    text = Text(tok.decode(sample.tokens[:prompt_len].tolist()), style="dim")
    assert sample.loss_mask is not None  # a completed sample has one
    mask = sample.loss_mask.tolist()
    start = 0
    while start < len(mask):
        end = start
        while end < len(mask) and mask[end] == mask[start]:
            end += 1
        ids = sample.tokens[prompt_len + start : prompt_len + end].tolist()
        text.append(tok.decode(ids), style="bold green" if mask[start] else "cyan")
        start = end
    console.rule("trajectory (dim: first prompt, cyan: bridge, green: generated)")
    console.print(text)
    console.rule("sample")
    console.print({
        "tokens": len(sample.tokens), "response_length": sample.response_length,
        "generated": int(sum(mask)), "status": sample.status, "reward": sample.reward,
        "weight_versions": sample.weight_versions,
        "strict_mismatches": [m for m in sample.metadata.get("tito_session_mismatch", [])
                              if m["type"] != "assistant_text"],
    })


async def main_async(args: argparse.Namespace) -> int:
    config = ServerConfig(tokenizer=args.tokenizer, family=args.family, engine="mock",
                          port=0, log_level="warning")
    stack = await start_stack(config)
    try:
        async with SessionTracer(stack.url) as tracer:
            prompt = [{"role": "system", "content": "You are a weather assistant."},
                      {"role": "user", "content": 'THINK Paris first.\n'
                                                  'CALL get_weather {"city": "Paris"}'}]
            samples = await generate(weather_agent, prompt, {"max_new_tokens": 256},
                                     tracer=tracer, metadata={"demo": True})
        show(samples[0], stack.gateway.renderer.tokenizer)
        print(json.dumps({"turns": samples[0].metadata.get("turns"),
                          "status": samples[0].status}))
    finally:
        await stack.close()
    return 0


def main() -> int:
    default = Path(__file__).resolve().parents[3] / "shared/fixtures/tokenizers/qwen3"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default=str(default) if default.is_dir() else None,
                   required=not default.is_dir(), help="tokenizer folder")
    p.add_argument("--family", default="qwen3", help="model family")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
