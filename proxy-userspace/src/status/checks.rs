//! Component-style health endpoints on 10249 (SPEC §3.1–§3.2): which checks
//! `/livez`, `/readyz` and `/healthz` run, and their answers in the format
//! of the apiserver's `healthz` package. Pure: check outcomes in, status
//! code and body out.

/// One named check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Check {
    Ping,
    DatapathProgress,
    InformerSync,
    DatapathSynced,
    Localnet,
    Shutdown,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Check::Ping => "ping",
            Check::DatapathProgress => "datapath-progress",
            Check::InformerSync => "informer-sync",
            Check::DatapathSynced => "datapath-synced",
            Check::Localnet => "localnet",
            Check::Shutdown => "shutdown",
        }
    }
}

/// A component health endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthEndpoint {
    Livez,
    Readyz,
    Healthz,
}

impl HealthEndpoint {
    pub const ALL: [HealthEndpoint; 3] = [
        HealthEndpoint::Livez,
        HealthEndpoint::Readyz,
        HealthEndpoint::Healthz,
    ];

    /// `livez`, `readyz`, `healthz`: the path and the SLI `type` label.
    pub fn name(self) -> &'static str {
        match self {
            HealthEndpoint::Livez => "livez",
            HealthEndpoint::Readyz => "readyz",
            HealthEndpoint::Healthz => "healthz",
        }
    }

    /// The checks, in the order they run and are listed.
    pub fn checks(self) -> &'static [Check] {
        match self {
            HealthEndpoint::Livez | HealthEndpoint::Healthz => {
                &[Check::Ping, Check::DatapathProgress]
            }
            HealthEndpoint::Readyz => &[
                Check::Ping,
                Check::InformerSync,
                Check::DatapathSynced,
                Check::Localnet,
                Check::Shutdown,
            ],
        }
    }

    pub fn check(self, name: &str) -> Option<Check> {
        self.checks().iter().copied().find(|c| c.name() == name)
    }
}

/// What happened to one check of a root request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// The reason is logged and shown by the per-check path only.
    Failed(String),
    Excluded,
}

/// Status code and body of a root request. `unmatched_excludes` are the
/// `exclude` values that named no check of this endpoint.
pub fn render_root(
    endpoint: HealthEndpoint,
    outcomes: &[(Check, Outcome)],
    unmatched_excludes: &[String],
    verbose: bool,
) -> (u16, String) {
    let failed = outcomes
        .iter()
        .any(|(_, o)| matches!(o, Outcome::Failed(_)));
    if !failed && !verbose {
        return (200, "ok".to_owned());
    }
    let mut body = String::new();
    for (check, outcome) in outcomes {
        let line = match outcome {
            Outcome::Passed => format!("[+]{} ok\n", check.name()),
            Outcome::Excluded => format!("[+]{} excluded: ok\n", check.name()),
            Outcome::Failed(_) => format!("[-]{} failed: reason withheld\n", check.name()),
        };
        body.push_str(&line);
    }
    if !unmatched_excludes.is_empty() {
        let mut names = unmatched_excludes.to_vec();
        names.sort();
        names.dedup();
        let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
        body.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            quoted.join(",")
        ));
    }
    let verdict = if failed { "failed" } else { "passed" };
    body.push_str(&format!("{} check {verdict}\n", endpoint.name()));
    (if failed { 500 } else { 200 }, body)
}

/// Status code and body of `/NAME/CHECK`.
pub fn render_single(result: &Result<(), String>) -> (u16, String) {
    match result {
        Ok(()) => (200, "ok".to_owned()),
        Err(reason) => (500, format!("internal server error: {reason}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passed(e: HealthEndpoint) -> Vec<(Check, Outcome)> {
        e.checks().iter().map(|c| (*c, Outcome::Passed)).collect()
    }

    #[test]
    fn all_passing_is_ok_without_newline() {
        for e in HealthEndpoint::ALL {
            assert_eq!(
                render_root(e, &passed(e), &[], false),
                (200, "ok".to_owned())
            );
        }
    }

    #[test]
    fn verbose_lists_checks_in_order() {
        let (code, body) = render_root(
            HealthEndpoint::Livez,
            &passed(HealthEndpoint::Livez),
            &[],
            true,
        );
        assert_eq!(code, 200);
        assert_eq!(
            body,
            "[+]ping ok\n[+]datapath-progress ok\nlivez check passed\n"
        );
    }

    #[test]
    fn failure_is_always_verbose_and_withholds_the_reason() {
        let mut outcomes = passed(HealthEndpoint::Readyz);
        outcomes[1].1 = Outcome::Failed("secret detail".to_owned());
        let (code, body) = render_root(HealthEndpoint::Readyz, &outcomes, &[], false);
        assert_eq!(code, 500);
        assert_eq!(
            body,
            "[+]ping ok\n[-]informer-sync failed: reason withheld\n[+]datapath-synced ok\n\
             [+]localnet ok\n[+]shutdown ok\nreadyz check failed\n"
        );
    }

    #[test]
    fn excluded_and_unknown_excludes() {
        let mut outcomes = passed(HealthEndpoint::Readyz);
        outcomes[1].1 = Outcome::Excluded;
        let unknown = ["zz".to_owned(), "nope".to_owned()];
        let (code, body) = render_root(HealthEndpoint::Readyz, &outcomes, &unknown, true);
        assert_eq!(code, 200);
        assert_eq!(
            body,
            "[+]ping ok\n[+]informer-sync excluded: ok\n[+]datapath-synced ok\n[+]localnet ok\n\
             [+]shutdown ok\nwarn: some health checks cannot be excluded: no matches for \"nope\",\"zz\"\n\
             readyz check passed\n"
        );
    }

    #[test]
    fn single_check_answers() {
        assert_eq!(render_single(&Ok(())), (200, "ok".to_owned()));
        assert_eq!(
            render_single(&Err("not synced".to_owned())),
            (500, "internal server error: not synced\n".to_owned())
        );
        assert_eq!(
            HealthEndpoint::Readyz.check("informer-sync"),
            Some(Check::InformerSync)
        );
        assert_eq!(HealthEndpoint::Livez.check("informer-sync"), None);
    }
}
