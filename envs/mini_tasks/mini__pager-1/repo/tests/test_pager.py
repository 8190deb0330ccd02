import pytest

from pager import iter_chunks, list_page, page_bounds, page_count


def test_page_bounds_first_page():
    assert page_bounds(0, 10) == (0, 10)


def test_page_bounds_later_page():
    assert page_bounds(3, 25) == (75, 100)


def test_page_bounds_rejects_negative_index():
    with pytest.raises(ValueError):
        page_bounds(-1, 10)


def test_page_count():
    assert [page_count(n, 10) for n in (0, 1, 10, 11, 25)] == [0, 1, 1, 2, 3]


def test_iter_chunks():
    assert list(iter_chunks(list(range(7)), 3)) == [[0, 1, 2], [3, 4, 5], [6]]


def test_iter_chunks_empty():
    assert list(iter_chunks([], 3)) == []


def test_list_page_metadata():
    result = list_page(list(range(25)), page=2, per_page=10)
    assert (result["page"], result["total"], result["pages"]) == (2, 25, 3)


def test_list_page_caps_per_page():
    assert list_page(list(range(500)), per_page=1000)["per_page"] == 100


def test_list_page_rejects_page_zero():
    with pytest.raises(ValueError):
        list_page([1, 2, 3], page=0)
