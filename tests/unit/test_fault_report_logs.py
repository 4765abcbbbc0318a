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
