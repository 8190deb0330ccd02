"""``relearn serve``: an OpenAI-compatible Chat Completions endpoint over a trained model folder.

A stand-in for vLLM where there is none (CPU machines, smoke tests), answering the same
requests the same way, so that ``relearn eval run --policy chat`` evaluates a checkpoint
through the client path it would use against vLLM:

    relearn serve runs/r1/model --port 8000 --model-name r1
    relearn eval run --out evals/r1 --base-url http://127.0.0.1:8000/v1 --model r1 --policy chat

``python -m relearn.cli.serve`` is the same command without the ``relearn`` entry point.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from relearn.cli.output import EXIT_OK, EXIT_USAGE, err, out
from relearn.serve import DEFAULT_MAX_NEW_TOKENS


def serve_command(
    model_dir: Annotated[Path, typer.Argument(metavar="MODEL_DIR", help="Hugging Face model folder, e.g. RUN/model from `relearn train`.")],
    tokenizer: Annotated[str | None, typer.Option(help="`qwen3.6` or a tokenizer folder (default: the one saved in MODEL_DIR).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8000,
    model_name: Annotated[
        str | None, typer.Option(help="Name clients send as `model` (default: MODEL_DIR as given, as vLLM names it).")
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option(help="Output limit of a request that sets no max_tokens (also capped by the context left).")
    ] = DEFAULT_MAX_NEW_TOKENS,
    max_context: Annotated[
        int | None, typer.Option(help="Context window in tokens, prompt plus output (default: the model's position limit).")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda.")] = "cpu",
    seed: Annotated[
        int | None, typer.Option(help="Seed: the n-th request after start samples the same way every run (a request's own seed wins).")
    ] = None,
) -> None:
    """Serve MODEL_DIR on POST /v1/chat/completions (plus GET /v1/models, GET /health) until Ctrl-C.

    Requests are answered one at a time. Reasoning and tool calls are parsed as vLLM's qwen3 reasoning parser and qwen3_coder tool parser do; return_token_ids and logprobs work as in vLLM.
    """
    import torch

    from relearn.serve.server import serve

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        err.print(f"[red]--device must be cpu or cuda, not {device!r}[/red]")
        raise typer.Exit(EXIT_USAGE)
    if device != "cpu" and not torch.cuda.is_available():
        err.print("[red]--device cuda: no CUDA device is available here[/red]")
        raise typer.Exit(EXIT_USAGE)
    if not model_dir.is_dir():
        err.print(f"[red]no such model folder: {model_dir}[/red]")
        raise typer.Exit(EXIT_USAGE)
    try:
        tok: Any = None
        if tokenizer is not None:
            from relearn.masks.tokenizers import load_tokenizer

            tok = load_tokenizer(tokenizer)
        with err.status(f"loading {model_dir}"):
            server = serve(
                model_dir, tok, host=host, port=port, model_name=model_name, max_new_tokens=max_new_tokens,
                max_context=max_context, device=device, seed=seed, log=lambda line: err.print(line, markup=False, highlight=False, style="dim"),
            )  # fmt: skip
    except ValueError as e:
        hint = "" if tokenizer is not None or "tokenizer" not in str(e) else " (pass --tokenizer qwen3.6 or a folder)"
        err.print(f"[red]cannot serve {model_dir}: {e}{hint}[/red]", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    except OSError as e:  # mostly: the port is taken, or the address is not this machine's
        err.print(f"[red]cannot serve {model_dir} on {host}:{port}: {e}[/red]", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None

    # Ctrl-C and SIGTERM from here on close the server and exit 0; during loading they still
    # interrupt at once.
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        engine = server.engine
        out.print(server.url, markup=False, highlight=False)  # alone on stdout, for scripts
        err.print(
            f"serving [bold]{engine.model_name}[/bold] ({engine.max_context:,} tokens of context) on {device}; "
            f"evaluate with: relearn eval run --base-url {server.url} --model {engine.model_name} --policy chat ...; Ctrl-C stops",
            highlight=False,
        )
        while not stop.wait(0.5):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.close()
    err.print("stopped")
    raise typer.Exit(EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(_app)
    _app()
