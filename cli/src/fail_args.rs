//! The command line, fault-injection part: checks each `--fail RULE` of `memwarden run`
//! before anything starts (a bad rule is one line pointing at its bad part) and turns the
//! rules into what the preload reads: `MEMWARDEN_FAIL` (canonical texts joined with `;`) and
//! `MEMWARDEN_SEED`.

use std::ffi::OsStr;

use memwarden_faults::{parse_rule, to_text, RULE_SEPARATOR};

use crate::args::{usage, UsageError};

/// Variable holding the rules for the preload.
pub const FAIL_VARIABLE: &str = "MEMWARDEN_FAIL";
/// Variable holding the seed of `p=` rules for the preload.
pub const SEED_VARIABLE: &str = "MEMWARDEN_SEED";

/// The canonical text of the rule given to `--fail`, or why it is refused.
pub fn rule(value: &OsStr) -> Result<String, UsageError> {
    let Some(text) = value.to_str() else {
        return Err(usage(format!(
            "--fail '{}': a rule must be UTF-8 text",
            value.to_string_lossy()
        )));
    };
    match parse_rule(text) {
        Ok(rule) => Ok(to_text(&rule)),
        Err(e) => Err(usage(format!(
            "--fail '{}': {}",
            text.escape_debug(),
            e.describe(text)
        ))),
    }
}

/// `MEMWARDEN_FAIL` for these canonical rule texts.
pub fn variable(rules: &[String]) -> String {
    rules.join(&RULE_SEPARATOR.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(text: &str) -> String {
        rule(OsStr::new(text)).unwrap_err().to_string()
    }

    #[test]
    fn rules_become_canonical_text() {
        assert_eq!(rule(OsStr::new("nth=3")).unwrap(), "calls=malloc,nth=3");
        assert_eq!(
            rule(OsStr::new(" budget=100MB , calls=new")).unwrap(),
            "calls=new,budget=100MB"
        );
        assert_eq!(
            variable(&["calls=malloc,nth=3".into(), "calls=new,p=0.5".into()]),
            "calls=malloc,nth=3;calls=new,p=0.5"
        );
    }

    #[test]
    fn refusals_quote_the_rule_and_point_at_the_bad_part() {
        assert_eq!(
            refusal("nth=3,sz>=1MB"),
            "--fail 'nth=3,sz>=1MB': unknown key 'sz' at characters 7-8 (keys: calls, nth, \
             every, p, times, after-bytes, size>=, budget, in, not-in, site, process) \
             (see memwarden --help)"
        );
        assert_eq!(
            refusal("size>=10XB"),
            "--fail 'size>=10XB': bad unit 'XB' (units: B, K, KB, KiB, M, MB, MiB, G, GB, \
             GiB) at characters 9-10 (see memwarden --help)"
        );
        assert_eq!(
            refusal("p=2"),
            "--fail 'p=2': probability '2' is out of range (0 < p <= 1, or 0% < p <= 100%) \
             at character 3 (see memwarden --help)"
        );
        assert!(refusal("nth=1\nx").starts_with("--fail 'nth=1\\nx': "));
        assert!(!refusal("in=a,b;c").contains('\n'));
    }

    #[test]
    fn run_takes_rules_and_a_seed() {
        use crate::args::{parse, Command};
        let argv = |args: &[&str]| parse(args.iter().map(Into::into).collect());
        let given = [
            "run",
            "--fail",
            "nth=3",
            "--fail=calls=new,p=1%",
            "--seed",
            "7",
            "ls",
        ];
        let Ok(Command::Run(run)) = argv(&given) else {
            panic!("refused");
        };
        assert_eq!(run.fail, ["calls=malloc,nth=3", "calls=new,p=0.01"]);
        assert_eq!(run.seed, 7);
        let Ok(Command::Run(plain)) = argv(&["run", "ls"]) else {
            panic!("refused");
        };
        assert_eq!((plain.fail.len(), plain.seed), (0, 0));
        let refused = |args: &[&str]| argv(args).unwrap_err().to_string();
        assert_eq!(
            refused(&["run", "--seed", "-1", "ls"]),
            "option --seed expects a whole number from 0 to 18446744073709551615, not '-1' \
             (see memwarden --help)"
        );
        assert!(refused(&["run", "--fail", "sz=1", "ls"]).starts_with("--fail 'sz=1': unknown key"));
        assert_eq!(
            refused(&["run", "--fail"]),
            "option --fail needs a value (see memwarden --help)"
        );
    }

    #[test]
    fn non_utf8_rules_are_refused() {
        use std::os::unix::ffi::OsStrExt;
        let text = OsStr::from_bytes(b"nth=\xff");
        assert_eq!(
            rule(text).unwrap_err().to_string(),
            "--fail 'nth=\u{fffd}': a rule must be UTF-8 text (see memwarden --help)"
        );
    }
}
