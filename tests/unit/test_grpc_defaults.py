"""proto.grpc_defaults: minipulsar's processes pick the iomgr transport unless told otherwise."""
from __future__ import annotations

import os
import subprocess
import sys

from proto.grpc_defaults import GRPC_EXPERIMENTS_DEFAULT

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _experiments_after_import(package: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if env_value is not None:
        env["GRPC_EXPERIMENTS"] = env_value
    code = f"import {package}, os; print(repr(os.environ.get('GRPC_EXPERIMENTS')))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_each_package_sets_the_default_before_grpc_loads():
    for package in ("client", "broker", "bookie", "deploy"):
        assert _experiments_after_import(package, None) == repr(GRPC_EXPERIMENTS_DEFAULT), package


def test_a_value_set_by_the_user_is_kept_even_empty():
    assert _experiments_after_import("client", "") == repr("")
    assert _experiments_after_import("broker", "-event_engine_dns") == repr("-event_engine_dns")


def test_nothing_changes_once_grpc_is_loaded():
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    code = "import grpc, os; import client; print(repr(os.environ.get('GRPC_EXPERIMENTS')))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"
