"""A local OpenAI-compatible server for the semantic stage's tests: `/v1/embeddings` with a
deterministic stub embedding model, and `/v1/chat/completions` with a stub judge.

The stub model is a hashed bag of words and character trigrams (512 dimensions, L2
normalised): it sees shared vocabulary, not meaning, so it finds light paraphrases and misses
heavy ones. It exists to exercise the mechanics (retrieval, thresholds, storage, fallbacks)
end to end over HTTP; what a real embedding model adds is measured elsewhere (docs/dedup.md).
The judge answers from the same similarity, in the JSON the judge prompt asks for.
"""

from __future__ import annotations

import json
import re
import zlib
from contextlib import contextmanager
from typing import Iterator

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.serving import running_server

DIM = 512
_WORD = re.compile(r"[a-z0-9]+")


def stub_embedding(text: str) -> np.ndarray:
    words = _WORD.findall(text.lower())
    grams = words + [w[i: i + 3] for w in words for i in range(max(1, len(w) - 2))]
    vec = np.zeros(DIM, np.float32)
    for g in grams:
        h = zlib.crc32(g.encode())
        vec[h % DIM] += 1.0 if (h >> 16) & 1 else -1.0
    norm = np.linalg.norm(vec)
    return vec / norm if norm else vec


def make_app(judge_threshold: float = 0.5) -> FastAPI:
    app = FastAPI()
    app.state.calls = {"embeddings": 0, "chat": 0}

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        body = await request.json()
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
            return JSONResponse({"error": {"message": "input must be a string or a list of strings"}}, 400)
        app.state.calls["embeddings"] += 1
        data = [{"object": "embedding", "index": i, "embedding": stub_embedding(x).tolist()}
                for i, x in enumerate(inputs)]
        return JSONResponse({"object": "list", "data": data, "model": body.get("model", "stub")})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        app.state.calls["chat"] += 1
        user = body["messages"][-1]["content"]
        reference, task = re.findall(r"<<<\n(.*?)\n>>>", user, re.DOTALL)[:2]
        cos = float(stub_embedding(reference) @ stub_embedding(task))
        verdict = "contaminated" if cos >= judge_threshold else "clean"
        answer = json.dumps({"verdict": verdict, "rationale": f"stub judge: bag-of-words cosine {cos:.2f}"})
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                          "finish_reason": "stop"}], "model": body.get("model", "stub-judge")})

    return app


@contextmanager
def running(app: FastAPI) -> Iterator[str]:
    """Serve `app` on a loopback port; yields the base URL ending in /v1."""
    with running_server(app) as base:
        yield f"{base}/v1"
