#!/usr/bin/env python3
"""Python benchmark workload for scripts/bench.py: pure-Python object churn.

Builds and drops lists, dicts, tuples, strings and small class instances in loops, the
way code that parses records, indexes them and formats output does. Most objects are
small (Python's own small-object allocator serves them); the lists, dicts and joined
strings of a batch are large enough to reach malloc. No third-party module. Deterministic.

Usage: bench_py_objects.py [SCALE]   (SCALE multiplies the number of batches; default 1.0)
"""

import sys

BATCHES = 24
BATCH = 10000  # records per batch


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def moved(self, dx, dy):
        return Point(self.x + dx, self.y + dy)


class Record:
    __slots__ = ("key", "name", "tags", "where", "score")

    def __init__(self, key, name, tags, where, score):
        self.key = key
        self.name = name
        self.tags = tags
        self.where = where
        self.score = score


def make_batch(b):
    lines = [f"{b}-{i},item {i % 97},{i % 7};{i % 11};{i % 13},{i * 0.5:.1f},{i % 31}" for i in range(BATCH)]
    records = []
    for line in lines:
        key, name, tags, x, y = line.split(",")
        records.append(Record(key, name, tags.split(";"), Point(float(x), int(y)), len(name) * 3))
    return records


def churn(b):
    records = make_batch(b)
    by_key = {r.key: r for r in records}
    by_name = {}
    for r in records:
        by_name.setdefault(r.name, []).append(r)
    moved = [r.where.moved(1, -1) for r in records]
    rows = [{"key": r.key, "name": r.name.upper(), "tags": tuple(r.tags), "x": p.x} for r, p in zip(records, moved)]
    text = "\n".join(f"{row['key']}\t{row['name']}\t{'|'.join(row['tags'])}" for row in rows)
    words = text.split()
    counts = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    kept = [r for r in records if r.score % 5 == 0]
    result = len(by_key) + len(by_name) + len(text) + len(kept) + top[0][1]
    del records, by_key, by_name, moved, rows, text, words, counts  # the batch is dropped
    return result


def main():
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    checksum = 0
    survivors = []  # a few objects outlive their batch, as caches do
    for b in range(max(1, round(BATCHES * scale))):
        checksum += churn(b)
        survivors.append((b, f"batch {b}", [b] * 8))
        if len(survivors) > 100:
            del survivors[:50]
    print(f"objects checksum {checksum}")


if __name__ == "__main__":
    main()
