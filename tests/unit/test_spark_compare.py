import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from client.spark import compare  # noqa: E402


def table(tmp_path, name, flights):
    d = tmp_path / name
    d.mkdir()
    pd.DataFrame({"carrier": ["AA", "UA"], "hour": [5, 6], "flights": flights,
                  "mean_dep_delay": [1.0 / 3, 2.5], "cancellations": [0, 1]}).to_parquet(d / "part-0.parquet")
    return str(d)


def test_identical_and_different_tables(tmp_path, capsys):
    a, b, c = table(tmp_path, "a", [3, 4]), table(tmp_path, "b", [3, 4]), table(tmp_path, "c", [3, 5])
    assert compare.main([a, b]) == 0
    assert "identical across clusters: yes" in capsys.readouterr().out
    assert compare.main([a, c]) == 1
    assert compare.main([a, str(tmp_path / "missing")]) == 2
