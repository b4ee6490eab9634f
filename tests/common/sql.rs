//! A generated SQL workload for the sqlite3 shell, shared by the tests that run a real
//! program under memwarden (stress, guards).

use std::fmt::Write as _;

/// A deterministic SQL script: `rows` inserts in one transaction, then indexing, updates,
/// deletes, aggregates and point queries.
pub fn sql_script(rows: u32) -> String {
    let mut sql = String::from(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, score INTEGER, grp INTEGER);\nBEGIN;\n",
    );
    for i in 0..rows {
        let _ = writeln!(
            sql,
            "INSERT INTO t(name, score, grp) VALUES('name-{i}-{}', {}, {});",
            "x".repeat((i % 40) as usize),
            (u64::from(i) * 7919) % 100_003,
            i % 97
        );
    }
    sql.push_str(
        "COMMIT;\n\
         CREATE INDEX t_grp ON t(grp, score);\n\
         SELECT count(*), sum(score), max(length(name)) FROM t;\n\
         SELECT grp, count(*), max(score), min(name) FROM t GROUP BY grp ORDER BY grp LIMIT 10;\n\
         UPDATE t SET score = score + 1 WHERE grp % 3 = 0;\n\
         DELETE FROM t WHERE id % 10 = 0;\n\
         SELECT count(*), sum(score) FROM t;\n\
         SELECT name FROM t ORDER BY score DESC, id LIMIT 5;\n\
         SELECT group_concat(name, ',') FROM (SELECT name FROM t WHERE grp = 42 ORDER BY id LIMIT 20);\n",
    );
    for k in 0..500u32 {
        let _ = writeln!(
            sql,
            "SELECT id, score FROM t WHERE id = {};",
            (k * 97) % rows + 1
        );
    }
    sql
}
