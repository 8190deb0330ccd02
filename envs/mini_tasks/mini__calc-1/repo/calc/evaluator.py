"""Recursive-descent evaluator.

Grammar, from lowest to highest precedence::

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/" | "%") unary)*
    unary  := ("-" | "+") unary | power
    power  := atom ("^" atom)*
    atom   := NUMBER | "(" expr ")"
"""
from .tokenizer import CalcError, tokenize


class _Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.pos = 0

    def peek(self):
        if self.pos < len(self.tokens):
            return self.tokens[self.pos]
        return None

    def advance(self):
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def at_op(self, *ops):
        token = self.peek()
        return token is not None and token.kind == "op" and token.value in ops

    def parse(self):
        value = self.expr()
        token = self.peek()
        if token is not None:
            raise CalcError(f"unexpected {token.value!r} at position {token.pos}")
        return value

    def expr(self):
        value = self.term()
        while self.at_op("+", "-"):
            op = self.advance().value
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self):
        value = self.unary()
        while self.at_op("*", "/", "%"):
            op = self.advance()
            rhs = self.unary()
            if op.value in "/%" and rhs == 0:
                raise CalcError(f"division by zero at position {op.pos}")
            if op.value == "*":
                value = value * rhs
            elif op.value == "/":
                value = value / rhs
            else:
                value = value % rhs
        return value

    def unary(self):
        if self.at_op("-"):
            self.advance()
            return -self.unary()
        if self.at_op("+"):
            self.advance()
            return self.unary()
        return self.power()

    def power(self):
        value = self.atom()
        while self.at_op("^"):
            self.advance()
            value = value ** self.atom()
        return value

    def atom(self):
        token = self.peek()
        if token is None:
            raise CalcError("unexpected end of expression")
        if token.kind == "num":
            self.advance()
            return token.value
        if token.kind == "lparen":
            self.advance()
            value = self.expr()
            closing = self.peek()
            if closing is None or closing.kind != "rparen":
                raise CalcError(f"missing ')' for '(' at position {token.pos}")
            self.advance()
            return value
        raise CalcError(f"expected a number or '(' at position {token.pos}")


def evaluate(text):
    """Evaluate the arithmetic expression *text* and return its value."""
    tokens = tokenize(text)
    if not tokens:
        raise CalcError("empty expression")
    return _Parser(tokens).parse()
