"""Single-turn RL rollouts (Math, Code, instruction following): the task records, the shipped
mini suite, and one verifier per kind (``math``: math-verify against the reference answer;
``code``: the task's unit tests on the extracted program in a sandboxed container;
``instructions``: IFEval's checkers for the prompt's verifiable constraints)."""
