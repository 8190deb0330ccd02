"""``relearn`` (and ``python -m relearn``): the command, Ctrl-C included from its first instant.

The verbs' modules take about a second to import; a Ctrl-C then would end in a traceback from
whichever import it hit. Nothing is written before the verbs run, so that one line says so.
"""

from __future__ import annotations

import signal
import sys

EXIT_INTERRUPTED = 130  # as relearn.cli.errors says it; that module is not imported yet


def main() -> None:
    try:
        from relearn.cli.logs import route_third_party_output

        route_third_party_output()
        from relearn.cli.main import app
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted (Ctrl-C) while relearn was starting; nothing was done\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    try:
        app()
    except KeyboardInterrupt:  # between start-up and the verb, where click would say "Aborted!" and exit 1
        sys.stderr.write("error: interrupted (Ctrl-C) before the command began; nothing was done\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    finally:
        # The verb has answered: a Ctrl-C now would land in a package's exit handler as a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    main()
