"""A stand-in for the judge model: a real OpenAI-compatible HTTP server with scripted answers.

TEST DOUBLE. It stands in for Qwen2.5-14B-Instruct served by vLLM, which cannot run on these
machines. It speaks the same protocol (POST /v1/chat/completions) and writes answers in the
formats real judges use, so the reward server is exercised end to end over HTTP.

    python tests/standin_judge.py --port 8001 [--latency 0.05]

Behaviour, set with ``POST /control {"mode": ..., "latency": seconds}``:
- ``ok``: relevance from the overlap of query words with the documents, written in varied
  formats ("Relevance: 0.70", "**Relevance:** 70%", "Relevance: 7/10"); correctness from
  whether a reference answer's words occur in the prediction ("Correct: True").
- ``garbage``: prose without a score, always. ``flaky``: prose first, a score when asked again.
- ``error``: HTTP 500. ``slow``: answers after 30 s (past any sensible timeout).
- ``notjson``: HTTP 200 with a body that is not JSON.
``GET /stats`` counts the requests received.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

STATE = {"mode": "ok", "latency": 0.0, "calls": 0}
app = FastAPI(title="stand-in judge (test double)")


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 3}


def _field(text: str, label: str) -> str:
    match = re.search(rf"^{label}: (.*)$", text, flags=re.M)
    return match.group(1) if match else ""


def scripted_answer(messages: list[dict]) -> str:
    system, user = messages[0]["content"], messages[1]["content"]
    if STATE["mode"] == "garbage" or (STATE["mode"] == "flaky" and len(messages) == 2):
        return "Hmm, that is a difficult one. I would rather not commit to anything here."
    if system.startswith("You grade retrieval"):
        query = _words(_field(user, "The agent's search query"))
        documents = _words(user.split("Documents returned:", 1)[-1].split("\n\nScale:", 1)[0])
        score = round(len(query & documents) / len(query), 2) if query else 0.0
        style = int(hashlib.md5(user.encode()).hexdigest(), 16) % 3
        line = [f"Relevance: {score:.2f}", f"**Relevance:** {round(score * 100)}%", f"Relevance: {score * 10:g}/10"][
            style
        ]
        return f"The documents {'cover' if score >= 0.5 else 'barely touch'} what the query asks for.\n{line}"
    golds = [g.strip() for g in _field(user, "Reference answers").split("|")]
    prediction = _words(_field(user, "Predicted answer"))
    correct = any(_words(g) and _words(g) <= prediction for g in golds)
    return f"The prediction {'names' if correct else 'does not name'} a reference answer.\nCorrect: {correct}"


@app.post("/v1/chat/completions")
async def chat(request: Request):
    STATE["calls"] += 1
    body = await request.json()
    if STATE["latency"]:
        await asyncio.sleep(STATE["latency"])
    if STATE["mode"] == "error":
        return JSONResponse(status_code=500, content={"error": "stand-in judge failing on purpose"})
    if STATE["mode"] == "slow":
        await asyncio.sleep(30)
    if STATE["mode"] == "notjson":
        return PlainTextResponse("<html>proxy error</html>")
    text = scripted_answer(body["messages"])
    return {
        "id": "standin",
        "object": "chat.completion",
        "model": body.get("model", "standin"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": len(text.split()), "total_tokens": 0},
    }


@app.post("/control")
async def control(request: Request):
    body = await request.json()
    if body.get("reset"):
        STATE["calls"] = 0
    for key in ("mode", "latency"):
        if key in body:
            STATE[key] = body[key]
    return STATE


@app.get("/stats")
async def stats():
    return STATE


@app.get("/v1/models")
async def models():
    return {"object": "list", "data": [{"id": "standin-judge", "object": "model"}]}


@app.get("/health")
async def health():
    return {"status": "ok"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    STATE["latency"] = args.latency
    # a "slow" answer still sleeping when the tests stop the stand-in must not hold its exit for 30 s
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, timeout_graceful_shutdown=1
    )
