"""Metadata node paths, shared by the stores: validation and tree arithmetic (pure functions).

A path is an absolute, '/'-separated str like a ZooKeeper znode path: ``/`` (the
root) or ``/seg[/seg...]`` with no empty, ``.`` or ``..`` segment, no trailing
``/`` and no NUL character.
"""
from __future__ import annotations

from typing import Any

__all__ = ["check_path", "check_writable", "split_path", "is_under", "ancestors"]


def check_path(path: Any) -> str:
    """Return ``path`` if it is a valid absolute node path, else raise ValueError."""
    if not isinstance(path, str):
        raise ValueError(f"metadata path must be a str, got {type(path).__name__}")
    if path == "/":
        return path
    if not path.startswith("/"):
        raise ValueError(f"metadata path must start with '/': {path!r}")
    if path.endswith("/"):
        raise ValueError(f"metadata path must not end with '/': {path!r}")
    if "\x00" in path:
        raise ValueError(f"metadata path must not contain NUL: {path!r}")
    for segment in path[1:].split("/"):
        if segment == "":
            raise ValueError(f"metadata path has an empty segment: {path!r}")
        if segment in (".", ".."):
            raise ValueError(f"metadata path must not contain '.' or '..' segments: {path!r}")
    return path


def check_writable(path: Any) -> str:
    """``check_path``, and the root ``/`` is refused too (ValueError): it cannot be written or deleted."""
    path = check_path(path)
    if path == "/":
        raise ValueError("the root node '/' cannot be written or deleted")
    return path


def split_path(path: str) -> tuple[str, str]:
    """``/a/b/c`` -> (``/a/b``, ``c``); ``/a`` -> (``/``, ``a``)."""
    parent, _, name = path.rpartition("/")
    return (parent or "/"), name


def is_under(path: str, prefix: str) -> bool:
    """True when ``path`` is ``prefix`` or below it (``/a`` covers ``/a`` and ``/a/x``, not ``/ab``)."""
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def ancestors(path: str) -> list[str]:
    """The ancestors of ``path`` below the root, outermost first: ``/a/b/c`` -> [``/a``, ``/a/b``]."""
    parts = path.split("/")[1:-1]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]
