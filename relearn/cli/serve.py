"""``relearn serve``: OpenAI-compatible Chat Completions and Responses endpoints over a trained model folder.

A stand-in for vLLM where there is none (CPU machines, smoke tests), answering the same
requests the same way, so that ``relearn eval run --policy chat`` (or ``--agent codex-cli``,
the Codex CLI on the Responses API) evaluates a checkpoint through the client path it
would use against vLLM:

    relearn serve runs/r1/model --port 8000 --model-name r1
    relearn eval run --out evals/r1 --base-url http://127.0.0.1:8000/v1 --model r1 --policy chat
    relearn eval run --out evals/r1-codex --base-url http://127.0.0.1:8000/v1 --model r1 --agent codex-cli

``python -m relearn.cli.serve`` is the same command without the ``relearn`` entry point. The
flags are ``relearn.serve.ServeOptions``' fields.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import asdict
from typing import Any

import typer

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_USAGE, err, out
from relearn.serve import ServeOptions


def refuse(message: str) -> typer.Exit:
    err.print(f"[red]{message}[/red]", highlight=False)
    return typer.Exit(EXIT_USAGE)


def start(options: ServeOptions) -> Any:
    """The server, listening; exits 2 naming what cannot be served."""
    import torch

    from relearn.masks.tokenizers import load_tokenizer
    from relearn.serve.server import serve

    device, model_dir = options.device, options.model_dir
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise refuse(f"--device must be cpu or cuda, not {device!r}")
    if device != "cpu" and not torch.cuda.is_available():
        raise refuse("--device cuda: no CUDA device is available here")
    if not model_dir.is_dir():
        raise refuse(f"no such model folder: {model_dir}")
    settings = {k: v for k, v in asdict(options).items() if k not in ("model_dir", "tokenizer")}
    try:
        tokenizer = None if options.tokenizer is None else load_tokenizer(options.tokenizer)
        with err.status(f"loading {model_dir}"):
            return serve(model_dir, tokenizer, **settings, log=lambda line: err.print(line, markup=False, highlight=False, style="dim"))
    except ValueError as e:
        hint = "" if options.tokenizer is not None or "tokenizer" not in str(e) else " (pass --tokenizer qwen3.6 or a folder)"
        raise refuse(f"cannot serve {model_dir}: {e}{hint}") from None
    except OSError as e:  # mostly: the port is taken, or the address is not this machine's
        raise refuse(f"cannot serve {model_dir} on {options.host}:{options.port}: {e}") from None


def serve_model(options: ServeOptions) -> None:
    server = start(options)
    # Ctrl-C and SIGTERM from here on close the server and exit 0; during loading they still
    # interrupt at once.
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda _signum, _frame: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        name = server.engine.model_name
        out.print(server.url, markup=False, highlight=False)  # alone on stdout, for scripts
        err.print(
            f"serving [bold]{name}[/bold] ({server.engine.max_context:,} tokens of context) on {options.device}; "
            f"evaluate with: relearn eval run --base-url {server.url} --model {name} --policy chat (or --agent codex-cli) ...; Ctrl-C stops",
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
    app.command("serve")(command(ServeOptions, serve_model))


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(_app)
    _app()
