#!/bin/bash
# The task's verifier: the repository's own tests plus held-out ones; reward 1 when all pass.
cd /app
if PYTHONPATH=/app python3 -m pytest -q -p no:cacheprovider test_calc.py /tests/test_held_out.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
