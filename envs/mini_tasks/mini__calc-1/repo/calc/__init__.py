from .evaluator import evaluate
from .tokenizer import CalcError, Token, tokenize

__all__ = ["evaluate", "tokenize", "Token", "CalcError"]
