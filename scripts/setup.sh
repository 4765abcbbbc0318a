#!/usr/bin/env bash
# One-line set-up: create .venv and install minipulsar with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
echo "minipulsar installed in .venv (activate with: source .venv/bin/activate)"
