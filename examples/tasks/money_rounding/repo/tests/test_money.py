from money import round_cents, split_evenly


def test_plain_rounding():
    assert round_cents(1.234) == 1.23
    assert round_cents(1.236) == 1.24


def test_half_cent_rounds_up():
    assert round_cents(0.125) == 0.13
    assert round_cents(2.675) == 2.68


def test_negative_half_rounds_away_from_zero():
    assert round_cents(-0.125) == -0.13


def test_split_evenly():
    assert split_evenly(10.0, 3) == [3.34, 3.33, 3.33]
