"""proto.data_dir_lock and proto.lifeline in one process: the lock names its holder and how
to stop it, is free again once released; the exec wrapper keeps the command."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from proto import lifeline
from proto.data_dir_lock import DataDirLocked, lock_data_dir, lock_holder, unlock_data_dir


def test_a_held_lock_names_the_holder_and_how_to_stop_it(tmp_path):
    fd = lock_data_dir(tmp_path, "broker", "broker.lock")
    try:
        assert (tmp_path / "broker.lock").read_text() == f"{os.getpid()}\n"
        assert lock_holder(tmp_path, "broker.lock") == os.getpid()
        with pytest.raises(DataDirLocked) as err:      # flock: a second open file is refused too
            lock_data_dir(tmp_path, "broker", "broker.lock")
        assert isinstance(err.value, OSError) and err.value.holder_pid == os.getpid()
        text = str(err.value)
        assert text.startswith(f"data dir {tmp_path} is in use by another broker process (pid {os.getpid()} (")
        assert f"stop it with `kill {os.getpid()}` (`kill -9 {os.getpid()}` if it does not exit)" in text
    finally:
        unlock_data_dir(fd)
    assert lock_holder(tmp_path, "broker.lock") is None
    unlock_data_dir(lock_data_dir(tmp_path, "broker", "broker.lock"))


def test_a_lock_file_without_a_pid_and_a_missing_file(tmp_path):
    assert lock_holder(tmp_path, "none.lock") is None
    fd = lock_data_dir(tmp_path, "x", "a.lock")
    try:
        os.ftruncate(fd, 0)
        with pytest.raises(DataDirLocked) as err:
            lock_data_dir(tmp_path, "x", "a.lock")
        assert err.value.holder_pid is None and "pid ?" in str(err.value)
    finally:
        unlock_data_dir(fd)
    with pytest.raises(FileNotFoundError):
        lock_data_dir(tmp_path / "missing", "x", "a.lock")


def test_lifeline_runs_the_command_itself_with_its_arguments(tmp_path):
    with pytest.raises(ValueError):
        lifeline.wrap([])
    with pytest.raises(ValueError):
        lifeline.popen("echo hi")
    proc = lifeline.popen([sys.executable, "-c", "import os, sys; print(os.getpid(), sys.argv[1:])", "a b", "c"],
                          stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert out.split(" ", 1) == [str(proc.pid), "['a b', 'c']\n"]      # exec'd: same pid, arguments intact
    missing = lifeline.popen([str(tmp_path / "no-such-program")], stderr=subprocess.PIPE, text=True)
    _, err = missing.communicate(timeout=30)
    assert missing.returncode == 1 and "cannot run" in err
