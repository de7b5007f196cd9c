from merge import deep_merge


def test_flat_override():
    assert deep_merge({"a": 1, "b": 2}, {"b": 3}) == {"a": 1, "b": 3}


def test_two_levels():
    assert deep_merge({"db": {"host": "x", "port": 1}}, {"db": {"port": 2}}) == {
        "db": {"host": "x", "port": 2}
    }


def test_three_levels():
    base = {"svc": {"db": {"host": "x", "port": 1}}}
    assert deep_merge(base, {"svc": {"db": {"port": 2}}}) == {"svc": {"db": {"host": "x", "port": 2}}}


def test_inputs_unchanged():
    base = {"svc": {"db": {"port": 1}}}
    deep_merge(base, {"svc": {"db": {"port": 2}}})
    assert base == {"svc": {"db": {"port": 1}}}
