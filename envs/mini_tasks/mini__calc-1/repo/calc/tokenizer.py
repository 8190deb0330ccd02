"""Split an expression into tokens."""
import re
from dataclasses import dataclass


class CalcError(ValueError):
    """Raised for malformed expressions."""


@dataclass(frozen=True)
class Token:
    kind: str  # "num", "op", "lparen" or "rparen"
    value: object
    pos: int


OPERATORS = "+-*/%^"
_TOKEN_RE = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|(.))")


def tokenize(text):
    """Return the list of tokens in *text*."""
    tokens = []
    text = text.rstrip()
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        number, other = match.group(1), match.group(2)
        if number is not None:
            value = float(number) if "." in number else int(number)
            tokens.append(Token("num", value, match.start(1)))
        elif other in OPERATORS:
            tokens.append(Token("op", other, match.start(2)))
        elif other == "(":
            tokens.append(Token("lparen", other, match.start(2)))
        elif other == ")":
            tokens.append(Token("rparen", other, match.start(2)))
        else:
            raise CalcError(f"unexpected character {other!r} at position {match.start(2)}")
        pos = match.end()
    return tokens
