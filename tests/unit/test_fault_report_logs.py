"""The fault suite puts the tails of the servers' stderr logs into a failed scenario's
report (tests/faults/conftest.py); this checks the tails it takes."""
from tests.faults.harness import server_log_tails


def test_server_log_tails_takes_the_last_lines_of_every_stderr_log(tmp_path):
    (tmp_path / "broker").mkdir()
    (tmp_path / "bookie-0").mkdir()
    (tmp_path / "broker" / "broker.stderr.log").write_text("\n".join(f"line {i}" for i in range(200)) + "\n")
    (tmp_path / "bookie-0" / "bookie.stderr.log").write_text("")
    (tmp_path / "broker" / "broker.stdout.log").write_text("not a stderr log\n")
    tails = dict(server_log_tails(tmp_path, lines=3))
    assert tails == {"bookie-0/bookie.stderr.log": "", "broker/broker.stderr.log": "line 197\nline 198\nline 199"}


async def test_task_state_names_how_a_task_ended():
    import asyncio

    from tests.faults.harness import _task_state

    async def fail():
        raise ValueError("boom")

    never = asyncio.get_running_loop().create_future()
    running = asyncio.ensure_future(never)
    failed = asyncio.ensure_future(fail())
    returned = asyncio.ensure_future(asyncio.sleep(0))
    cancelled = asyncio.ensure_future(asyncio.sleep(10))
    cancelled.cancel()
    await asyncio.wait([failed, returned, cancelled])
    assert [_task_state(t) for t in (None, running, failed, returned, cancelled)] == \
        ["none", "running", "ValueError('boom')", "returned", "cancelled"]
    running.cancel()
