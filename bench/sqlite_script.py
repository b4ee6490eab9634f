"""Writes the SQL script of the "sqlite" benchmark workload to stdout: a deterministic
mix of inserts (in transactions of 10,000), indexing, updates, deletes, joins,
aggregates and point queries, run by `sqlite3 :memory:`. Usage: sqlite_script.py [ROWS]"""

import sys


def script(rows: int) -> str:
    out = [
        "CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, price INTEGER, grp INTEGER, note TEXT);",
        "CREATE TABLE grp(id INTEGER PRIMARY KEY, label TEXT);",
    ]
    out += [f"INSERT INTO grp VALUES({g}, 'group-{g}');" for g in range(100)]
    for start in range(0, rows, 10_000):
        out.append("BEGIN;")
        for i in range(start, min(rows, start + 10_000)):
            note = "n" * (i % 60)
            out.append(
                f"INSERT INTO item(name, price, grp, note) VALUES('item-{i}', {(i * 7919) % 100_003}, {i % 100}, '{note}');"
            )
        out.append("COMMIT;")
    out += [
        "CREATE INDEX item_grp ON item(grp, price);",
        "CREATE INDEX item_name ON item(name);",
        "SELECT count(*), sum(price), max(length(note)) FROM item;",
        "SELECT g.label, count(*), avg(i.price) FROM item i JOIN grp g ON g.id = i.grp GROUP BY g.id ORDER BY g.id LIMIT 20;",
        "UPDATE item SET price = price + 1 WHERE grp % 3 = 0;",
        "DELETE FROM item WHERE id % 10 = 0;",
        "SELECT count(*), sum(price) FROM item;",
        "SELECT name FROM item ORDER BY price DESC, id LIMIT 10;",
        "SELECT grp, group_concat(name, ',') FROM (SELECT grp, name FROM item WHERE id < 2000 ORDER BY id) GROUP BY grp LIMIT 5;",
    ]
    out += [f"SELECT id, price FROM item WHERE name = 'item-{(k * 97) % rows}';" for k in range(20_000)]
    out += [
        f"SELECT count(*), sum(price) FROM item WHERE grp = {k % 100} AND price BETWEEN {k * 37 % 90_000} AND {k * 37 % 90_000 + 5_000};"
        for k in range(2_000)
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(script(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000))
