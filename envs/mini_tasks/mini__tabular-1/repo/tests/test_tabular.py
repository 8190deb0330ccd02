import pytest

from tabular import column, numeric_summary, read_rows

CSV_TEXT = "name , qty,price\r\nwidget, 3 ,2.50\r\n\r\ngadget,10,\r\n\"bolt, large\",1,0.25\r\n"


@pytest.fixture
def plain_csv(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_bytes(CSV_TEXT.encode("utf-8"))
    return path


def test_read_rows(plain_csv):
    rows = read_rows(plain_csv)
    assert rows == [
        {"name": "widget", "qty": "3", "price": "2.50"},
        {"name": "gadget", "qty": "10", "price": ""},
        {"name": "bolt, large", "qty": "1", "price": "0.25"},
    ]


def test_semicolon_delimiter(tmp_path):
    path = tmp_path / "semi.csv"
    path.write_text("a;b\n1;2\n", encoding="utf-8")
    assert read_rows(path, delimiter=";") == [{"a": "1", "b": "2"}]


def test_non_ascii_values(tmp_path):
    path = tmp_path / "cities.csv"
    path.write_text("city\nZ\u00fcrich\nS\u00e3o Paulo\n", encoding="utf-8")
    assert column(read_rows(path), "city") == ["Z\u00fcrich", "S\u00e3o Paulo"]


def test_numeric_summary(plain_csv):
    summary = numeric_summary(read_rows(plain_csv), "price")
    assert summary == {"count": 2, "min": 0.25, "max": 2.5, "mean": 1.375}


def test_numeric_summary_empty_column(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("x,y\n1,\n2,\n", encoding="utf-8")
    assert numeric_summary(read_rows(path), "y")["count"] == 0
