"""The committed generated protobuf code must match the .proto sources."""
from proto import generate


def test_generated_code_is_fresh(capsys):
    rc = generate.main(["--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
