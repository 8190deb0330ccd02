#!/bin/bash
set -euo pipefail
cd /app
sed -i 's/return a - b/return a + b/' calc.py
python3 -m pytest -q -p no:cacheprovider
