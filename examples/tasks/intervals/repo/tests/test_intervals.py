from intervals import merge_all, overlaps


def test_disjoint():
    assert not overlaps((1, 2), (4, 5))


def test_overlapping():
    assert overlaps((1, 5), (3, 8))
    assert merge_all([(3, 8), (1, 5), (10, 12)]) == [(1, 8), (10, 12)]


def test_touching_endpoints_overlap():
    assert overlaps((1, 3), (3, 5))


def test_touching_intervals_merge():
    assert merge_all([(3, 5), (1, 3)]) == [(1, 5)]


def test_point_interval():
    assert overlaps((2, 2), (1, 4))
