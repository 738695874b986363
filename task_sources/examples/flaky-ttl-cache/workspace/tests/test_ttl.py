from cache.ttl import TTLCache


def test_size_counts_entries():
    c = TTLCache(10)
    c.put("a", 1)
    assert c.size() == 1


def test_jitter_within_bounds():
    # Deliberately flaky: it passes about 40% of the time (the jitter goes up to 1.5x).
    c = TTLCache(10)
    assert c.jittered_ttl() <= c.ttl_s * 0.9
