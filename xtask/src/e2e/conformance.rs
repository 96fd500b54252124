//! `cargo xtask conformance [--proxy-mode ebpf|nftables] [--filter RE]
//! [--json] [--write-docs]`: kube-proxy's upstream e2e tests
//! (kubernetes/kubernetes `test/e2e/network/*.go`) whose outcome depends on
//! the proxy, each as a scenario in the e2e bed named exactly as ginkgo
//! prints the upstream test, run once on each datapath.
//!
//! Each scenario ends as PASS, FAIL, N/A (the upstream test does not apply
//! to this datapath; the reason is printed and goes into the docs table),
//! XFAIL (listed in [`KNOWN_FAILING`]: a behaviour that differs from
//! kube-proxy today, with the issue that fixes it; not counted as failed)
//! or XPASS (listed there but passed: counted as failed, so that the list
//! is trimmed when a fix lands). The closing line is `N passed, N failed`.
//!
//! The results of a run are kept in `target/conformance/<mode>.json` (a
//! `--filter` run replaces the rows of the scenarios it ran and keeps the
//! others); with both datapaths' results there, `docs/conformance.md` is
//! written from them (at the end of a run of both datapaths without
//! `--filter`, or with `--write-docs` alone).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use regex::Regex;
use serde_json::{json, Value};

use super::{bed, preflight, print_daemon_logs, scenarios};

/// The datapaths, in the docs table's column order.
pub const MODES: &[&str] = &["ebpf", "nftables"];

/// Upstream tests whose scenario fails today, on the given datapaths, and
/// the issue item whose fix makes it pass. The lead trims this list as the
/// fixes land: a listed scenario that passes fails the run (XPASS).
pub const KNOWN_FAILING: &[(&str, &[&str], &str)] = &[];

/// One upstream test as a scenario of the bed.
pub struct Case {
    /// The upstream test's full name, as ginkgo prints it.
    pub name: &'static str,
    pub run: fn(&mut bed::Bed) -> Result<()>,
    /// (datapath or `*`, why the upstream test does not apply to it).
    pub not_applicable: &'static [(&'static str, &'static str)],
}

pub struct Options {
    /// The datapaths to run, in order.
    pub modes: Vec<String>,
    pub filter: Option<Regex>,
    pub json: bool,
    /// Only write `docs/conformance.md` from the kept results.
    pub write_docs: bool,
}

pub fn parse_args(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        modes: MODES.iter().map(|m| (*m).to_owned()).collect(),
        filter: None,
        json: false,
        write_docs: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--proxy-mode" => {
                let mode = it.next().context("--proxy-mode needs a value")?;
                if !MODES.contains(&mode.as_str()) {
                    bail!("conformance: --proxy-mode is one of {MODES:?}, not {mode}");
                }
                opts.modes = vec![mode.clone()];
            }
            "--filter" => {
                let re = it.next().context("--filter needs a value")?;
                opts.filter = Some(Regex::new(re).with_context(|| format!("--filter {re}"))?);
            }
            "--json" => opts.json = true,
            "--write-docs" => opts.write_docs = true,
            other => bail!("conformance: unknown argument {other}"),
        }
    }
    Ok(opts)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    Pass,
    Fail,
    NotApplicable,
    /// Failed, and [`KNOWN_FAILING`] lists it.
    ExpectedFail,
    /// Passed, yet [`KNOWN_FAILING`] lists it: a failure of the list.
    UnexpectedPass,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::NotApplicable => "N/A",
            Outcome::ExpectedFail => "XFAIL",
            Outcome::UnexpectedPass => "XPASS",
        }
    }

    fn parse(label: &str) -> Option<Outcome> {
        [
            Outcome::Pass,
            Outcome::Fail,
            Outcome::NotApplicable,
            Outcome::ExpectedFail,
            Outcome::UnexpectedPass,
        ]
        .into_iter()
        .find(|o| o.label() == label)
    }

    pub fn is_failure(self) -> bool {
        matches!(self, Outcome::Fail | Outcome::UnexpectedPass)
    }
}

pub struct Row {
    pub name: &'static str,
    pub mode: String,
    pub outcome: Outcome,
    pub seconds: f64,
    /// The failure, the N/A reason, or the issue item of an XFAIL/XPASS.
    pub detail: String,
}

fn known_failing(name: &str, mode: &str) -> Option<&'static str> {
    KNOWN_FAILING
        .iter()
        .find(|(n, modes, _)| *n == name && modes.contains(&mode))
        .map(|(_, _, why)| *why)
}

fn not_applicable(case: &Case, mode: &str) -> Option<&'static str> {
    case.not_applicable
        .iter()
        .find(|(m, _)| *m == mode || *m == "*")
        .map(|(_, why)| *why)
}

/// The cases `filter` selects.
pub fn selected(filter: Option<&Regex>) -> Vec<Case> {
    scenarios::conformance()
        .into_iter()
        .filter(|c| filter.is_none_or(|re| re.is_match(c.name)))
        .collect()
}

/// Runs the selected cases on one datapath; prints a line per case (to
/// stderr with `--json`, stdout keeps the JSON document).
pub fn run_mode(root: &Path, mode: &str, opts: &Options) -> Result<Vec<Row>> {
    preflight()?;
    let cases = selected(opts.filter.as_ref());
    let daemon_bin = crate::paths::daemon_bin(root);
    let mut bed = bed::Bed::new(mode, daemon_bin)?;
    let say = |line: String| {
        if opts.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    say(format!(
        "conformance: proxy-mode {mode}, {} upstream tests ({})",
        cases.len(),
        bed::describe(&bed)
    ));
    let mut rows = Vec::new();
    for case in cases {
        let started = Instant::now();
        let (outcome, detail) = match not_applicable(&case, mode) {
            Some(why) => (Outcome::NotApplicable, why.to_owned()),
            None => {
                let result = (case.run)(&mut bed);
                match (result, known_failing(case.name, mode)) {
                    (Ok(()), None) => (Outcome::Pass, String::new()),
                    (Ok(()), Some(why)) => (
                        Outcome::UnexpectedPass,
                        format!(
                            "passed, but KNOWN_FAILING lists it ({why}): remove it from the list"
                        ),
                    ),
                    (Err(e), None) => (Outcome::Fail, format!("{e:#}")),
                    (Err(e), Some(why)) => (Outcome::ExpectedFail, format!("{why}: {e:#}")),
                }
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        let mut line = format!("{} {} [{mode}] ({seconds:.1}s)", outcome.label(), case.name);
        if !detail.is_empty() {
            line.push_str(&format!(": {detail}"));
        }
        say(line);
        if outcome == Outcome::Fail {
            print_daemon_logs(&bed);
        }
        rows.push(Row {
            name: case.name,
            mode: mode.to_owned(),
            outcome,
            seconds,
            detail,
        });
    }
    drop(bed);
    Ok(rows)
}

fn results_path(root: &Path, mode: &str) -> PathBuf {
    root.join("target/conformance").join(format!("{mode}.json"))
}

fn rows_json(rows: &[Row]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "proxy_mode": r.mode,
                    "result": r.outcome.label(),
                    "seconds": (r.seconds * 10.0).round() / 10.0,
                    "detail": r.detail,
                })
            })
            .collect(),
    )
}

/// Keeps one datapath's results for the docs table.
pub fn save(root: &Path, mode: &str, rows: &[Row]) -> Result<()> {
    let path = results_path(root, mode);
    std::fs::create_dir_all(path.parent().context("results dir")?)?;
    std::fs::write(&path, serde_json::to_vec_pretty(&rows_json(rows))?)
        .with_context(|| format!("writing {}", path.display()))
}

/// Keeps the rows of a filtered run: they replace the kept rows of the
/// same scenarios, the others stay (rows of scenarios that no longer exist
/// go). Nothing kept yet: only these rows.
fn save_over(root: &Path, mode: &str, rows: &[Row]) -> Result<()> {
    let path = results_path(root, mode);
    let kept: Vec<Value> = match std::fs::read_to_string(&path) {
        Ok(text) => {
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let merged = merge_rows(kept, rows_json(rows), &scenarios::conformance());
    std::fs::create_dir_all(path.parent().context("results dir")?)?;
    std::fs::write(&path, serde_json::to_vec_pretty(&merged)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// `kept` with the rows of `fresh` in place of its rows of the same name,
/// in the order of `cases`; a row of no case is dropped.
fn merge_rows(kept: Vec<Value>, fresh: Value, cases: &[Case]) -> Value {
    let fresh = fresh.as_array().cloned().unwrap_or_default();
    let row_of = |name: &str| {
        fresh
            .iter()
            .chain(kept.iter())
            .find(|r| r["name"].as_str() == Some(name))
            .cloned()
    };
    Value::Array(cases.iter().filter_map(|c| row_of(c.name)).collect())
}

/// The closing counts: (passed, failed, expected failures, not applicable).
pub fn counts(rows: &[Row]) -> (usize, usize, usize, usize) {
    let n = |f: &dyn Fn(Outcome) -> bool| rows.iter().filter(|r| f(r.outcome)).count();
    (
        n(&|o| o == Outcome::Pass),
        n(&|o| o.is_failure()),
        n(&|o| o == Outcome::ExpectedFail),
        n(&|o| o == Outcome::NotApplicable),
    )
}

/// Prints the closing line (or the JSON document) and fails on a failure.
pub fn report(rows: &[Row], json: bool) -> Result<()> {
    let (passed, failed, xfail, na) = counts(rows);
    if json {
        let doc = json!({
            "results": rows_json(rows),
            "passed": passed,
            "failed": failed,
            "expected_failures": xfail,
            "not_applicable": na,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "{passed} passed, {failed} failed ({xfail} expected failures, {na} not applicable)"
        );
    }
    if failed > 0 {
        bail!("{failed} conformance scenario(s) failed");
    }
    Ok(())
}

/// `docs/conformance.md` from the kept results of both datapaths.
pub fn write_docs(root: &Path) -> Result<()> {
    let mut results: Vec<Vec<(String, Outcome, String)>> = Vec::new();
    for mode in MODES {
        let path = results_path(root, mode);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "no results of {mode} at {}: run `cargo xtask conformance --proxy-mode {mode}` first",
                path.display()
            )
        })?;
        let rows: Vec<Value> = serde_json::from_str(&text)?;
        results.push(
            rows.iter()
                .filter_map(|r| {
                    Some((
                        r["name"].as_str()?.to_owned(),
                        Outcome::parse(r["result"].as_str()?)?,
                        r["detail"].as_str().unwrap_or("").to_owned(),
                    ))
                })
                .collect(),
        );
    }
    let cell = |mode: usize, name: &str| -> String {
        match results[mode].iter().find(|(n, _, _)| n == name) {
            None => "not run".to_owned(),
            Some((_, Outcome::Pass, _)) => "pass".to_owned(),
            Some((_, Outcome::NotApplicable, why)) => format!("N/A: {why}"),
            // A result read against the list as it is now: an entry the
            // lead removed since the run reads as what it was.
            Some((_, Outcome::ExpectedFail, _)) => match known_failing(name, MODES[mode]) {
                Some(why) => format!("fails today ({why})"),
                None => "FAIL".to_owned(),
            },
            Some((_, Outcome::UnexpectedPass, _)) => match known_failing(name, MODES[mode]) {
                Some(_) => "pass (still in KNOWN_FAILING)".to_owned(),
                None => "pass".to_owned(),
            },
            Some((_, Outcome::Fail, _)) => "FAIL".to_owned(),
        }
    };
    let mut md = String::from(
        "# Conformance: kube-proxy's upstream e2e tests\n\n\
         Generated by `cargo xtask conformance` (both datapaths; `--write-docs` rewrites this\n\
         file from the last results in `target/conformance/`). Do not edit by hand.\n\n\
         Each row is an upstream test of kubernetes/kubernetes `test/e2e/network/` whose outcome\n\
         depends on kube-proxy, by the name ginkgo prints. Here each runs as a scenario of the e2e\n\
         bed (network namespaces, the real daemon and kernel datapath, no API server; see\n\
         `xtask/src/e2e/scenarios/upstream.rs`), once, on each datapath. \"fails today\" names\n\
         the issue whose fix makes it pass (`KNOWN_FAILING` in `xtask/src/e2e/conformance.rs`);\n\
         N/A gives the reason the upstream test does not apply. `cargo xtask test` runs the set\n\
         on both datapaths. The same set runs on a kind cluster with `deploy/kind/conformance.sh`.\n\n\
         | Upstream test | eBPF | nftables |\n|---|---|---|\n",
    );
    let mut names: Vec<&str> = scenarios::conformance().iter().map(|c| c.name).collect();
    names.sort_unstable();
    for name in names {
        md.push_str(&format!(
            "| {} | {} | {} |\n",
            name.replace('|', "\\|"),
            cell(0, name).replace('|', "\\|"),
            cell(1, name).replace('|', "\\|")
        ));
    }
    let path = root.join("docs/conformance.md");
    std::fs::create_dir_all(path.parent().context("docs dir")?)?;
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// `cargo xtask conformance ...`: builds what the bed runs, runs the
/// selected datapaths, keeps their results, prints them, and rewrites
/// `docs/conformance.md` after a run of both datapaths without a filter.
pub fn command(root: &Path, args: &[String]) -> Result<()> {
    let opts = parse_args(args)?;
    if opts.write_docs {
        return write_docs(root);
    }
    let rows = run_modes(root, &opts)?;
    if opts.filter.is_none() && opts.modes.len() == MODES.len() {
        write_docs(root)?;
    }
    report(&rows, opts.json)
}

/// Both datapaths, every case, for `cargo xtask test`.
pub fn run_all(root: &Path) -> Result<()> {
    let opts = parse_args(&[])?;
    let rows = run_modes(root, &opts)?;
    report(&rows, false)
}

fn run_modes(root: &Path, opts: &Options) -> Result<Vec<Row>> {
    if !crate::is_root() {
        bail!("the conformance run needs root (network namespaces, cgroups, eBPF)");
    }
    crate::ensure_debian_packages(&[("nft", "nftables"), ("conntrack", "conntrack")])?;
    if opts.modes.iter().any(|m| m == "ebpf") {
        crate::ebpf::build(root, true)?;
    }
    crate::run(crate::cargo().args(["build", "--bin", "ebpf-kube-proxy"]))?;
    let mut rows = Vec::new();
    for mode in &opts.modes {
        let started = Instant::now();
        let mode_rows = run_mode(root, mode, opts)?;
        if opts.filter.is_none() {
            save(root, mode, &mode_rows)?;
        } else {
            save_over(root, mode, &mode_rows)?;
        }
        let (passed, failed, xfail, na) = counts(&mode_rows);
        let line = format!(
            "conformance [{mode}]: {passed} passed, {failed} failed, {xfail} expected failures, {na} not applicable in {:.0}s",
            started.elapsed().as_secs_f64()
        );
        if opts.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
        rows.extend(mode_rows);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every KNOWN_FAILING entry names a scenario and a datapath it runs on.
    #[test]
    fn known_failing_names_existing_cases() {
        let cases = scenarios::conformance();
        for (name, modes, _) in KNOWN_FAILING {
            let case = cases.iter().find(|c| c.name == *name);
            assert!(case.is_some(), "KNOWN_FAILING names no scenario: {name}");
            for m in *modes {
                assert!(MODES.contains(m), "{name}: unknown datapath {m}");
                assert!(
                    not_applicable(case.unwrap(), m).is_none(),
                    "{name} is N/A on {m}, it cannot be a known failure there"
                );
            }
        }
    }

    /// Names are unique and carry the upstream Describe prefix.
    #[test]
    fn names_are_upstream_and_unique() {
        let cases = scenarios::conformance();
        let mut seen = std::collections::BTreeSet::new();
        for c in &cases {
            assert!(c.name.starts_with("[sig-network] "), "{}", c.name);
            assert!(seen.insert(c.name), "duplicate {}", c.name);
        }
    }

    #[test]
    fn a_filtered_run_replaces_only_its_rows() {
        let cases = scenarios::conformance();
        let (a, b) = (cases[0].name, cases[1].name);
        let kept = vec![
            json!({"name": b, "result": "FAIL"}),
            json!({"name": a, "result": "FAIL"}),
            json!({"name": "a test that is gone", "result": "PASS"}),
        ];
        let fresh = json!([{"name": a, "result": "PASS"}]);
        let merged = merge_rows(kept, fresh, &cases);
        assert_eq!(
            merged,
            json!([{"name": a, "result": "PASS"}, {"name": b, "result": "FAIL"}])
        );
    }

    #[test]
    fn filter_is_a_regex() {
        let opts = parse_args(&["--filter".into(), "Conntrack|KubeProxy".into()]).unwrap();
        let names: Vec<&str> = selected(opts.filter.as_ref())
            .iter()
            .map(|c| c.name)
            .collect();
        assert!(!names.is_empty());
        assert!(names
            .iter()
            .all(|n| n.contains("Conntrack") || n.contains("KubeProxy")));
    }
}
