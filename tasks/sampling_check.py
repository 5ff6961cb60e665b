"""Correctness under sampling: draw samples of the first tokens from a ready deployment, and write the
samples of one launch (analysis.sampling_check judges them; analysis.sampling_report writes the verdict).

Each prompt is one chat request with `n` = samples, `max_tokens` = tokens, the spec's temperature, top_p 1 and
`seed` = a base: vLLM gives child i of an `n` request the seed base + i (vllm/v1/engine/parallel_sampling.py),
so every sample has its own seed and a re-run draws the same samples. Each arm gets its own seed range, so the
arms' samples are independent draws (the permutation test assumes that). Requests go one prompt at a time.

The verdict's artifact (RAW/<campaign>/sampling_checks/<check_id>.json) keeps every arm's samples, so the
verdict can be recomputed from the file alone.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from artifacts.documents.sampling_checks import SampledArm
from experiments.spec import SamplingCheckSpec
from specgauge.errors import LaunchError
from tasks.launch.base import Deployment
from workloads.schema import Prompt

SEED_STRIDE = 1_000_000  # each arm's seeds start here apart: plain 0, plain again 1, treatments 2, 3, ...


def _body(deployment: Deployment, prompt: Prompt, check: SamplingCheckSpec, seed: int) -> dict[str, Any]:
    return {
        "model": deployment.served_model_name,
        "messages": prompt.chat_messages(),
        "n": check.samples,
        "seed": seed,
        "max_tokens": check.tokens,
        "temperature": check.temperature,
        "top_p": 1.0,
        "return_token_ids": True,
        "stream": False,
    }


def _token_ids(data: dict[str, Any], url: str, prompt_id: str, samples: int) -> list[list[int]]:
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != samples:
        raise LaunchError(f"{url}: {prompt_id}: asked for {samples} samples (n), got {len(choices)} choices")
    ids = [c.get("token_ids") for c in choices]
    if any(not isinstance(x, list) for x in ids):
        raise LaunchError(
            f"{url}: {prompt_id}: choices without token_ids (the server ignored return_token_ids)"
        )
    return [[int(t) for t in x] for x in ids]


async def draw_async(
    deployment: Deployment,
    prompts: list[Prompt],
    check: SamplingCheckSpec,
    *,
    role: str,
    seed_base: int,
    timeout_s: float = 300.0,
) -> SampledArm:
    """`check.samples` samples of each prompt's first `check.tokens` tokens, one prompt at a time."""
    root = deployment.base_url.rstrip("/")
    url = (root[: -len("/v1")] if root.endswith("/v1") else root) + "/v1/chat/completions"
    headers = deployment.headers()
    samples: dict[str, list[list[int]]] = {}
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as client:
        for index, prompt in enumerate(prompts):
            seed = seed_base + index * check.samples
            response = await client.post(url, json=_body(deployment, prompt, check, seed))
            if response.status_code != 200:
                raise LaunchError(f"{url}: {prompt.id}: HTTP {response.status_code}: {response.text[:300]}")
            samples[prompt.id] = _token_ids(response.json(), url, prompt.id, check.samples)
    return SampledArm(
        role=role,
        variant=deployment.variant.name,
        deployment_id=deployment.id,
        seed_base=seed_base,
        samples=samples,
        wall_s=round(time.perf_counter() - t0, 3),
    )  # the artifact's own block: analysis.sampling_report judges and writes it


def draw(
    deployment: Deployment, prompts: list[Prompt], check: SamplingCheckSpec, **options: Any
) -> SampledArm:
    """draw_async for callers outside an event loop."""
    return asyncio.run(draw_async(deployment, prompts, check, **options))
