"""`envforge policy`: serve a local model over an OpenAI-compatible API."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Policies: serve a local model over an OpenAI-compatible API.", no_args_is_help=True)


@app.command("serve")
def policy_serve(
    model: Path = typer.Argument(..., help="a local Hugging Face model directory"),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    threads: int = typer.Option(
        0,
        help="torch intra-op threads of the server process (0: torch's "
        "default, every core); give it its own share beside a "
        "trainer on the same CPUs",
    ),
    api_key: str | None = typer.Option(
        None, envvar="ENVFORGE_POLICY_API_KEY", help="require `Authorization: Bearer KEY` on every /v1/ route"
    ),
    max_batch: int = typer.Option(
        16, min=1, help="most sequences sampled together from concurrent requests (1: one request at a time)"
    ),
) -> None:
    """An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /v1/reload) over a local model.

    The stand-in for `vllm serve` on machines without a GPU: rollouts use it with
    `--policy openai:http://HOST:PORT/v1`, eval harnesses and the openai SDK with that base URL.
    """
    from envforge.rollout.policies.serve import serve

    serve(str(model), host, port, threads=threads, api_key=api_key, max_batch=max_batch)
