"""Writes the mini single-turn suite: envs/single_turn/suite/tasks.jsonl (Math, Code and IF
tasks), envs/single_turn/suite/rollouts.jsonl (scripted rollouts, early steps 1-20 and late
81-100) and harness/scripted/single_turn_judge.json (what the scripted keep judge and auditor answer
for each rollout, keyed by a digest of the response).

    python scripts/generate_single_turn_suite.py
"""

import hashlib
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "envs" / "single_turn" / "suite"
tasks, rollouts, answers = [], [], {}


def T(**kw):
    tasks.append(kw)
    return kw


def R(task, step, reasoning, content, reward, keep=None, drop_reason=None, excluded=None, audit="pass"):
    response = f"<think>\n{reasoning}\n</think>\n\n{content}" if reasoning is not None else content
    rollouts.append(
        {
            "prompt": task["prompt"],
            "response": response,
            "reward": reward,
            "step": step,
            "task_id": task["id"],
            "checkpoint": f"step-{step}",
        }
    )
    if keep is not None or drop_reason is not None:
        answers[hashlib.sha256(response.encode()).hexdigest()[:16]] = {
            "keep": {
                "decision": "drop" if drop_reason else "keep",
                "reason": drop_reason or "clean solution recovered",
                "intervals": [{"field": f, "quote": q} for f, q in (keep or [])],
                "excluded": excluded or [],
            },
            "audit": {"verdict": audit, "self_contained": audit == "pass", "correct": audit == "pass", "reason": "checked"},
        }


# ---------------------------------------------------------------- math (20)
math = [
    (
        "m01",
        "Compute 3/4 + 1/8. Give the answer as a fraction.",
        "\\frac{7}{8}",
        "3/4 = 6/8, so 6/8 + 1/8 = 7/8.",
        "7/8 is 0.875... no, I should add numerators over 4: (3+1)/4 = 1, so 1.",
        "\\frac{7}{8}",
    ),
    ("m02", "Solve for x: 2x + 6 = 14.", "4", "Subtract 6: 2x = 8. Divide by 2: x = 4.", "Subtract 6: 2x = 20, so x = 10.", "4"),
    (
        "m03",
        "What is the set of real solutions of x^2 = 9?",
        "\\{-3, 3\\}",
        "x^2 = 9 gives x = 3 or x = -3.",
        "x^2 = 9 gives x = 3 only, since square roots are positive.",
        "\\{-3, 3\\}",
    ),
    (
        "m04",
        "Simplify \\sqrt{50}.",
        "5\\sqrt{2}",
        "50 = 25 * 2, so \\sqrt{50} = 5\\sqrt{2}.",
        "50 = 10 * 5, so \\sqrt{50} = 10\\sqrt{5}.",
        "5\\sqrt{2}",
    ),
    ("m05", "What is 15% of 80?", "12", "0.15 * 80 = 12.", "0.15 * 80 = 1.2.", "12"),
    ("m06", "Compute the sum 1 + 2 + ... + 10.", "55", "The sum is n(n+1)/2 = 10*11/2 = 55.", "The sum is n(n-1)/2 = 10*9/2 = 45.", "55"),
    ("m07", "Evaluate 2^{10}.", "1024", "2^5 = 32 and 32^2 = 1024.", "2^10 = 2*10 = 20.", "1024"),
    (
        "m08",
        "Find the slope of the line through (1, 2) and (3, 8).",
        "3",
        "Slope = (8 - 2)/(3 - 1) = 6/2 = 3.",
        "Slope = (3 - 1)/(8 - 2) = 2/6 = 1/3.",
        "3",
    ),
    (
        "m09",
        "What is the greatest common divisor of 48 and 36?",
        "12",
        "48 = 2^4 * 3 and 36 = 2^2 * 3^2, so the gcd is 2^2 * 3 = 12.",
        "48 - 36 = 12 and 36 - 12 = 24, so the gcd is 24.",
        "12",
    ),
    (
        "m10",
        "Compute \\frac{2}{3} \\cdot \\frac{9}{4}.",
        "\\frac{3}{2}",
        "Multiply: 18/12 = 3/2.",
        "Multiply: 2*4 / (3*9) = 8/27.",
        "\\frac{3}{2}",
    ),
    (
        "m11",
        "Solve x^2 - 5x + 6 = 0 and give the solution set.",
        "\\{2, 3\\}",
        "The quadratic factors as (x - 2)(x - 3) = 0, so x = 2 or x = 3.",
        "The quadratic factors as (x - 1)(x - 6) = 0, so x = 1 or x = 6.",
        "\\{2, 3\\}",
    ),
    ("m12", "What is the area of a circle of radius 3?", "9\\pi", "Area = \\pi r^2 = 9\\pi.", "Area = 2\\pi r = 6\\pi.", "9\\pi"),
    (
        "m13",
        "Compute 0.25 + 0.5 as a fraction.",
        "\\frac{3}{4}",
        "0.25 = 1/4 and 0.5 = 2/4, so the sum is 3/4.",
        "0.25 + 0.5 = 0.30.",
        "\\frac{3}{4}",
    ),
    (
        "m14",
        "How many positive divisors does 12 have?",
        "6",
        "The divisors are 1, 2, 3, 4, 6, 12: six of them.",
        "12 = 2^2 * 3, so it has 2 * 1 = 2 divisors.",
        "6",
    ),
    ("m15", "Evaluate 7! / 5!.", "42", "7!/5! = 7 * 6 = 42.", "7!/5! = 7/5.", "42"),
    (
        "m16",
        "What is the median of 3, 9, 1, 7, 5?",
        "5",
        "Sorted: 1, 3, 5, 7, 9. The middle value is 5.",
        "The middle value as written is 1.",
        "5",
    ),
    (
        "m17",
        "Solve |x - 2| = 5 and give the solution set.",
        "\\{-3, 7\\}",
        "x - 2 = 5 gives x = 7; x - 2 = -5 gives x = -3.",
        "x - 2 = 5 gives x = 7, and that is the only case.",
        "\\{-3, 7\\}",
    ),
    ("m18", "Compute \\log_2 64.", "6", "64 = 2^6, so \\log_2 64 = 6.", "64 = 2^8, so \\log_2 64 = 8.", "6"),
    ("m19", "What is 1/3 + 1/6?", "\\frac{1}{2}", "1/3 = 2/6, so 2/6 + 1/6 = 3/6 = 1/2.", "1/3 + 1/6 = 2/9.", "\\frac{1}{2}"),
    ("m20", "A rectangle is 4 by 7. What is its perimeter?", "22", "Perimeter = 2(4 + 7) = 22.", "Perimeter = 4 * 7 = 28.", "22"),
]
for i, (tid, prompt, answer, good, bad, boxed) in enumerate(math):
    t = T(id=f"math-{tid}", kind="math", prompt=prompt + " Put the final answer in \\boxed{}.", answer=answer)
    final = f"The answer is $\\boxed{{{boxed}}}$."
    # late window: clean, but for every fourth problem a corrected slip
    if i % 4 == 1:
        R(
            t,
            81 + i,
            f"{bad} Wait, that is wrong. Let me redo it. {good}",
            final,
            1.0,
            keep=[("reasoning_content", good), ("content", final)],
            excluded=[{"category": "corrected_mistake", "description": "a wrong first attempt, corrected later"}],
        )
    else:
        R(t, 81 + i, good, final, 1.0, keep=[("reasoning_content", good), ("content", final)])
    pattern = i % 5
    step = 1 + i
    if pattern == 0:  # wrong then corrected
        reasoning = f"{bad} Wait, that is wrong. Let me redo it. {good}"
        R(
            t,
            step,
            reasoning,
            final,
            1.0,
            keep=[("reasoning_content", good), ("content", final)],
            excluded=[{"category": "corrected_mistake", "description": "a wrong first attempt, corrected later"}],
        )
    elif pattern == 1:  # repeated answer emission
        content = final + " " + " ".join([f"\\boxed{{{boxed}}}"] * 4)
        R(
            t,
            step,
            good,
            content,
            1.0,
            keep=[("reasoning_content", good), ("content", final)],
            excluded=[{"category": "redundant_exploration", "description": "the final answer emitted again and again"}],
        )
    elif pattern == 2:  # correct answer by wrong reasoning: no clean solution in the text
        R(t, step, f"{bad} Anyway, I recall the answer.", final, 1.0, drop_reason="the reasoning is wrong; the answer is not derived")
    elif pattern == 3:  # wrong final answer: the verifier drops it
        R(t, step, bad, "The answer is $\\boxed{-1}$.", 0.0)
    else:  # abandoned approach, then the clean one
        reasoning = f"Maybe I should try a numerical search over many candidates. Actually, that is unnecessary. {good}"
        R(
            t,
            step,
            reasoning,
            final,
            1.0,
            keep=[("reasoning_content", good), ("content", final)],
            excluded=[{"category": "abandoned_attempt", "description": "an approach started and dropped"}],
        )


# ---------------------------------------------------------------- code (10)
def stdio(i, o, hidden=False):
    return {"type": "stdio", "input": i, "output": o, "hidden": hidden}


def call(fn, args, expected, hidden=False):
    return {"type": "call", "function": fn, "args": args, "expected": expected, "hidden": hidden}


code = [
    (
        "c01",
        "Read two integers a and b from one line of standard input and print their sum.",
        [stdio("2 3\n", "5\n"), stdio("10 -4\n", "6\n", True), stdio("0 0\n", "0\n", True)],
        "a, b = map(int, input().split())\nprint(a + b)",
        "a, b = map(int, input().split())\nprint(a - b)",
    ),
    (
        "c02",
        "Write a function `is_palindrome(s)` that returns True when the string s reads the same backwards.",
        [call("is_palindrome", ["abba"], True), call("is_palindrome", ["abc"], False, True), call("is_palindrome", [""], True, True)],
        "def is_palindrome(s):\n    return s == s[::-1]",
        "def is_palindrome(s):\n    return s[0] == s[-1]",
    ),
    (
        "c03",
        "Read an integer n and print n factorial.",
        [stdio("5\n", "120\n"), stdio("0\n", "1\n", True), stdio("10\n", "3628800\n", True)],
        "import math\nprint(math.factorial(int(input())))",
        "n = int(input())\nr = 1\nfor i in range(1, n):\n    r *= i\nprint(r)",
    ),
    (
        "c04",
        "Write a function `fib(n)` returning the n-th Fibonacci number with fib(0) = 0 and fib(1) = 1.",
        [call("fib", [10], 55), call("fib", [0], 0, True), call("fib", [20], 6765, True)],
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        "def fib(n):\n    return n",
    ),
    (
        "c05",
        "Read a line of text and print it reversed.",
        [stdio("hello\n", "olleh\n"), stdio("ab c\n", "c ba\n", True)],
        "print(input()[::-1])",
        "print(input())",
    ),
    (
        "c06",
        "Write a function `count_vowels(s)` returning how many of the letters a, e, i, o, u (either case) s holds.",
        [call("count_vowels", ["Hello"], 2), call("count_vowels", ["AEIOU xyz"], 5, True)],
        "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')",
        "def count_vowels(s):\n    return sum(1 for c in s if c in 'aeiou')",
    ),
    (
        "c07",
        "Read integers separated by spaces on one line and print the largest.",
        [stdio("3 9 2\n", "9\n"), stdio("-5 -2 -9\n", "-2\n", True)],
        "print(max(map(int, input().split())))",
        "print(sorted(input().split())[-1])",
    ),
    (
        "c08",
        "Write a function `flatten(xs)` that flattens a list of lists one level deep.",
        [call("flatten", [[[1, 2], [3]]], [1, 2, 3]), call("flatten", [[[], [4, 5]]], [4, 5], True)],
        "def flatten(xs):\n    return [x for sub in xs for x in sub]",
        "def flatten(xs):\n    return xs[0]",
    ),
    (
        "c09",
        "Read an integer n and print the primes up to n separated by spaces.",
        [stdio("10\n", "2 3 5 7\n"), stdio("20\n", "2 3 5 7 11 13 17 19\n", True)],
        "n = int(input())\nprint(' '.join(str(p) for p in range(2, n + 1) if all(p % d for d in range(2, int(p ** 0.5) + 1))))",
        "n = int(input())\nprint(' '.join(str(p) for p in range(2, n + 1) if p % 2))",
    ),
    (
        "c10",
        "Write a function `word_count(s)` returning a dict from each word of s (split on whitespace) to its count.",
        [call("word_count", ["a b a"], {"a": 2, "b": 1}), call("word_count", [""], {}, True)],
        "def word_count(s):\n    counts = {}\n    for w in s.split():\n        counts[w] = counts.get(w, 0) + 1\n    return counts",
        "def word_count(s):\n    return {w: 1 for w in s.split()}",
    ),
]
for i, (tid, prompt, tests, good, bad) in enumerate(code):
    visible = [x for x in tests if not x["hidden"]]
    shown = "\n".join(
        f"Example: input {x['input']!r} gives output {x['output']!r}"
        if x["type"] == "stdio"
        else f"Example: {x['function']}(*{x['args']!r}) == {x['expected']!r}"
        for x in visible
    )
    t = T(id=f"code-{tid}", kind="code", prompt=f"{prompt} Answer with one Python program in a ```python block.\n{shown}", tests=tests)
    explain = "This handles every case the statement allows."
    good_block = f"```python\n{good}\n```"
    R(
        t,
        81 + i,
        f"I will write it directly. {explain}",
        f"{good_block}\n",
        1.0,
        keep=[("reasoning_content", f"I will write it directly. {explain}"), ("content", good_block)],
    )
    if i % 3 == 0:  # hard-codes the visible example: passes it, fails the hidden tests
        v = visible[0]
        hack = f"print({v['output'].strip()!r})" if v["type"] == "stdio" else f"def {v['function']}(*args):\n    return {v['expected']!r}"
        R(t, 1 + i, "The example is all I need to match.", f"```python\n{hack}\n```\n", 1.0)
    elif i % 3 == 1:  # wrong program first, then the fixed one (the last block is the answer)
        bad_block = f"```python\n{bad}\n```"
        R(
            t,
            1 + i,
            f"First try:\n{bad_block}\nThat fails the example, so fix it. {explain}",
            f"{good_block}\n",
            1.0,
            keep=[("reasoning_content", explain), ("content", good_block)],
            excluded=[{"category": "corrected_mistake", "description": "a buggy first program"}],
        )
    else:  # plainly wrong
        R(t, 1 + i, "Quick attempt.", f"```python\n{bad}\n```\n", 0.0)

# ---------------------------------------------------------------- instruction following (10)
IF = [
    (
        "i01",
        "Describe the ocean in one short paragraph. Do not use any commas.",
        [("punctuation:no_comma", {})],
        "The ocean is vast and deep. It covers most of the planet and hides many creatures.",
        "The ocean is vast, deep, and blue.",
    ),
    (
        "i02",
        "Write a sentence about tea that mentions the word 'kettle'.",
        [("keywords:existence", {"keywords": ["kettle"]})],
        "I put the kettle on for a pot of green tea.",
        "Tea is best when brewed slowly.",
    ),
    (
        "i03",
        "Answer in fewer than 12 words: why do leaves fall?",
        [("length_constraints:number_words", {"num_words": 12, "relation": "less than"})],
        "Trees drop leaves to save water in winter.",
        "Leaves fall because trees stop feeding them when days shorten and the weather gets colder.",
    ),
    (
        "i04",
        "Write your entire answer in lowercase letters: what is a river?",
        [("change_case:english_lowercase", {})],
        "a river is a natural stream of water flowing toward the sea.",
        "A River is a natural stream of water.",
    ),
    (
        "i05",
        "List three fruits as exactly 3 markdown bullet points.",
        [("detectable_format:number_bullet_lists", {"num_bullets": 3})],
        "* apple\n* pear\n* plum",
        "* apple\n* pear",
    ),
    (
        "i06",
        "Explain rain briefly and end your response with the exact phrase 'Is there anything else I can help with?'",
        [("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"})],
        "Rain is water that condenses in clouds and falls. Is there anything else I can help with?",
        "Rain is water that falls from clouds.",
    ),
    (
        "i07",
        "Write a short poem about snow with a title wrapped in double angular brackets, like <<title>>.",
        [("detectable_format:title", {})],
        "<<First Snow>>\nSoft and white it falls tonight.",
        "First Snow\nSoft and white it falls tonight.",
    ),
    (
        "i08",
        "Describe a cat without using the words 'dog' or 'bark'.",
        [("keywords:forbidden_words", {"forbidden_words": ["dog", "bark"]})],
        "A cat is a quiet and curious animal that loves naps.",
        "A cat is unlike a dog: it does not bark.",
    ),
    (
        "i09",
        "Give one tip for sleeping well. At the end add a postscript starting with P.S.",
        [("detectable_content:postscript", {"postscript_marker": "P.S."})],
        "Keep a regular bedtime.\n\nP.S. Avoid screens late at night.",
        "Keep a regular bedtime.",
    ),
    (
        "i10",
        "Your entire response must be in English capital letters: name a planet.",
        [("change_case:english_capital", {})],
        "MARS IS THE FOURTH PLANET FROM THE SUN AND IT LOOKS RED IN THE NIGHT SKY.",
        "Mars is the fourth planet from the Sun.",
    ),
]
for i, (tid, prompt, constraints, good, bad) in enumerate(IF):
    t = T(id=f"if-{tid}", kind="if", prompt=prompt, constraints=[{"id": c, "kwargs": k} for c, k in constraints])
    R(t, 81 + i, "Follow the constraint exactly.", good, 1.0)
    R(t, 1 + i, "Answer quickly.", bad if i % 2 == 0 else good, 1.0)

with open(ROOT / "tasks.jsonl", "w") as f:
    for t in tasks:
        f.write(json.dumps(t) + "\n")
with open(ROOT / "rollouts.jsonl", "w") as f:
    for r in rollouts:
        f.write(json.dumps(r) + "\n")
(REPO / "harness" / "scripted" / "single_turn_judge.json").write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
print(len(tasks), len(rollouts), len(answers))
