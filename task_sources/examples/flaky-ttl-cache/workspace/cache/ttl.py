import random
import time


class TTLCache:
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._data: dict = {}

    def put(self, key, value) -> None:
        self._data[key] = (value, time.monotonic())

    def get(self, key, default=None):
        item = self._data.get(key)
        if item is None:
            return default
        value, at = item
        if time.monotonic() - at > self.ttl_s:
            return default
        return value

    def jittered_ttl(self) -> float:
        return self.ttl_s * random.uniform(0.5, 1.5)

    def size(self) -> int:
        return len(self._data) + 1
