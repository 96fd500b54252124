//! The scale table: each figure against issue 17's goal (met / MISSED),
//! printed and written as markdown, plus `results.json`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::manifests::Scale;
use super::scale::{percentile, CellResult, Episode, Source};

/// One figure's goal: `value <= limit` (`None`: reported, no goal).
type Goal = Option<f64>;

/// One row of the table: a figure for one datapath and source.
struct Row {
    figure: &'static str,
    unit: &'static str,
    goal: Goal,
    /// The figure of a cell, or why there is none.
    value: fn(&CellResult) -> Result<f64, String>,
}

/// An episode's seconds, or why there are none.
fn seconds(e: &Result<Episode, String>) -> Result<f64, String> {
    e.as_ref().map(|e| e.seconds).map_err(Clone::clone)
}

/// The daemon's VmHWM with an episode, or why there is none.
fn peak_rss(e: &Result<Episode, String>) -> Result<f64, String> {
    e.as_ref().map(|e| e.peak_rss_mib).map_err(Clone::clone)
}

fn p99(samples: &[f64]) -> f64 {
    percentile(samples, 99.0)
}

fn p50(samples: &[f64]) -> f64 {
    percentile(samples, 50.0)
}

fn full_sync_goal(datapath: &str) -> Goal {
    match datapath {
        "ebpf" => Some(2.0),
        "nftables" => Some(10.0),
        _ => None,
    }
}

/// Issue 37: `exec` → every service answering.
fn served_goal(datapath: &str) -> Goal {
    match datapath {
        "ebpf" => Some(2.0),
        "nftables" => Some(5.0),
        _ => None,
    }
}

/// Issue 17's goals for `datapath` and `source`.
fn rows(datapath: &str, source: Source) -> Vec<Row> {
    let end_to_end = match (datapath, source) {
        (_, Source::Kube) | ("nftables", _) => 100.0,
        _ => 50.0,
    };
    let datapath_goal = match datapath {
        "ebpf" => Some(5.0),
        "nftables" => Some(50.0),
        _ => None,
    };
    let mut rows = vec![
        Row {
            figure: "exec → served: spawn to the first, middle and last service answering",
            unit: "s",
            goal: served_goal(datapath),
            value: |c| c.served_s.clone(),
        },
        Row {
            figure: "  … exec → whole state programmed, the daemon's own timestamp",
            unit: "s",
            goal: full_sync_goal(datapath),
            value: |c| c.full_sync_s.clone(),
        },
        Row {
            figure: "one change, end to end, p50",
            unit: "ms",
            goal: None,
            value: |c| {
                c.changes
                    .as_ref()
                    .map(|c| p50(&c.end_to_end))
                    .map_err(Clone::clone)
            },
        },
        Row {
            figure: "one change, end to end, p99",
            unit: "ms",
            goal: Some(end_to_end),
            value: |c| {
                c.changes
                    .as_ref()
                    .map(|c| p99(&c.end_to_end))
                    .map_err(Clone::clone)
            },
        },
        Row {
            figure: "one change, source → state, p50 / p99",
            unit: "ms",
            goal: None,
            value: |c| {
                c.changes
                    .as_ref()
                    .map(|c| p99(&c.source_to_state))
                    .map_err(Clone::clone)
            },
        },
        Row {
            figure: "one change, state → programmed, p99",
            unit: "ms",
            goal: datapath_goal,
            value: |c| {
                c.changes
                    .as_ref()
                    .map(|c| p99(&c.state_to_programmed))
                    .map_err(Clone::clone)
            },
        },
        Row {
            figure: "idle CPU after sync (% of a core)",
            unit: "%",
            goal: Some(1.0),
            value: |c| c.idle_cpu_pct.clone(),
        },
        Row {
            figure: "daemon peak RSS (VmHWM)",
            unit: "MiB",
            goal: Some(200.0),
            value: |c| c.peak_rss_mib.clone(),
        },
        Row {
            figure: "localnet: 100 watchers get a new revision, full frames",
            unit: "ms",
            goal: Some(500.0),
            value: |c| c.fanout_ms.clone(),
        },
        Row {
            figure: "  … the daemon's CPU for it",
            unit: "s",
            goal: None,
            value: |c| {
                c.fanout_cpu
                    .as_ref()
                    .map(|c| c.daemon_s)
                    .map_err(Clone::clone)
            },
        },
        Row {
            figure: "  … the watchers' CPU for it (receiving and decoding)",
            unit: "s",
            goal: None,
            value: |c| {
                c.fanout_cpu
                    .as_ref()
                    .map(|c| c.watchers_s)
                    .map_err(Clone::clone)
            },
        },
        Row {
            figure: "  … the same frame copied to 100 unix sockets, no gRPC (floor)",
            unit: "ms",
            goal: None,
            value: |c| c.fanout_floor_ms.clone(),
        },
        Row {
            figure: "  … full frames ÷ that floor, measured in the same run",
            unit: "×",
            goal: Some(1.5),
            value: CellResult::fanout_ratio,
        },
        Row {
            figure: "localnet: 100 watchers get a new revision, delta Watch",
            unit: "ms",
            goal: Some(500.0),
            value: |c| c.fanout_delta_ms.clone(),
        },
    ];
    if source == Source::Kube {
        rows.push(Row {
            figure: "relist after an API server restart: restart → relisted",
            unit: "s",
            goal: None,
            value: |c| seconds(&c.relist),
        });
        rows.push(Row {
            figure: "  … daemon peak RSS (VmHWM) with it",
            unit: "MiB",
            goal: Some(200.0),
            value: |c| peak_rss(&c.relist),
        });
    }
    if source == Source::File {
        rows.push(Row {
            figure: "every pod rotated, one burst of renamed manifests: rename → programmed",
            unit: "s",
            goal: None,
            value: |c| seconds(&c.rotation),
        });
        rows.push(Row {
            figure: "  … daemon peak RSS (VmHWM) with it",
            unit: "MiB",
            goal: Some(200.0),
            value: |c| peak_rss(&c.rotation),
        });
    }
    if datapath != "none" {
        rows.push(Row {
            figure: "restart under load: failed requests",
            unit: "",
            goal: Some(0.0),
            value: |c| {
                c.restart
                    .as_ref()
                    .map(|r| r.failed as f64)
                    .map_err(Clone::clone)
            },
        });
        rows.push(Row {
            figure: "restart under load: restart → reconciled",
            unit: "s",
            goal: full_sync_goal(datapath),
            value: |c| {
                c.restart
                    .as_ref()
                    .map(|r| r.reconcile_s)
                    .map_err(Clone::clone)
            },
        });
    }
    rows
}

fn number(v: f64, unit: &str) -> String {
    let digits = if v >= 100.0 || unit.is_empty() {
        0
    } else if v >= 10.0 {
        1
    } else if v >= 1.0 {
        2
    } else {
        3
    };
    let unit = if unit.is_empty() || unit == "%" || unit == "×" {
        unit.to_owned()
    } else {
        format!(" {unit}")
    };
    format!("{v:.digits$}{unit}")
}

fn cell_text(row: &Row, cell: &CellResult) -> String {
    match (row.value)(cell) {
        Ok(v) => {
            let mut text = number(v, row.unit);
            if row.figure.contains("p50 / p99") {
                // Both percentiles of the source's share.
                if let Ok(c) = &cell.changes {
                    text = format!(
                        "{} / {}",
                        number(p50(&c.source_to_state), ""),
                        number(v, row.unit)
                    );
                }
            }
            match row.goal {
                Some(limit) if v <= limit => format!("{text} met"),
                Some(_) => format!("**{text} MISSED**"),
                None => text,
            }
        }
        Err(e) => {
            let first = e.lines().next().unwrap_or("");
            let short: String = first.chars().take(60).collect();
            if row.goal.is_some() {
                format!("**MISSED: {short}**")
            } else {
                format!("error: {short}")
            }
        }
    }
}

fn goal_text(row: &Row) -> String {
    match row.goal {
        Some(g) => format!("≤ {}", number(g, row.unit)),
        None => "—".to_owned(),
    }
}

/// The markdown table: one row per figure, datapath and source; one
/// column per scale; `baselines` (`nft -f` seconds per scale label) as
/// the last rows.
pub fn markdown(
    cells: &[CellResult],
    scales: &[Scale],
    baselines: &BTreeMap<String, Result<f64, String>>,
) -> String {
    let mut out = String::from("| figure | datapath | source |");
    for s in scales {
        out.push_str(&format!(" {} |", s.label()));
    }
    out.push_str(" goal |\n|---|---|---|");
    for _ in scales {
        out.push_str("---|");
    }
    out.push_str("---|\n");
    let mut combos: Vec<(&'static str, Source)> = Vec::new();
    for c in cells {
        if !combos.contains(&(c.datapath, c.source)) {
            combos.push((c.datapath, c.source));
        }
    }
    for (datapath, source) in combos {
        for row in rows(datapath, source) {
            out.push_str(&format!(
                "| {} | {datapath} | {} |",
                row.figure,
                source.as_str()
            ));
            for s in scales {
                let text = cells
                    .iter()
                    .find(|c| c.scale == *s && c.datapath == datapath && c.source == source)
                    .map(|c| cell_text(&row, c))
                    .unwrap_or_else(|| "—".to_owned());
                out.push_str(&format!(" {text} |"));
            }
            out.push_str(&format!(" {} |\n", goal_text(&row)));
        }
    }
    if !baselines.is_empty() {
        out.push_str("| baseline: kube-proxy-shaped ruleset, one `nft -f` | nftables | — |");
        for s in scales {
            let text = match baselines.get(&s.label()) {
                Some(Ok(v)) => number(*v, "s"),
                Some(Err(e)) => format!("error: {}", e.lines().next().unwrap_or("")),
                None => "—".to_owned(),
            };
            out.push_str(&format!(" {text} |"));
        }
        out.push_str(" — |\n");
        out.push_str("| ratio: daemon full sync ÷ `nft -f` | nftables | file |");
        for s in scales {
            let daemon = cells
                .iter()
                .find(|c| c.scale == *s && c.datapath == "nftables" && c.source == Source::File);
            let text = match (daemon.map(|c| &c.full_sync_s), baselines.get(&s.label())) {
                (Some(Ok(d)), Some(Ok(b))) if *b > 0.0 => format!("{:.2}×", d / b),
                _ => "—".to_owned(),
            };
            out.push_str(&format!(" {text} |"));
        }
        out.push_str(" — |\n");
    }
    out
}

/// Counts of figures that met and missed their goal.
pub fn verdicts(cells: &[CellResult]) -> (usize, usize) {
    let (mut met, mut missed) = (0, 0);
    for c in cells {
        for row in rows(c.datapath, c.source) {
            let Some(limit) = row.goal else { continue };
            match (row.value)(c) {
                Ok(v) if v <= limit => met += 1,
                _ => missed += 1,
            }
        }
    }
    (met, missed)
}

pub fn json_report(
    cells: &[CellResult],
    baselines: &BTreeMap<String, Result<f64, String>>,
    commit: &str,
    quick: bool,
) -> Value {
    let baselines: BTreeMap<&String, Value> = baselines
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Ok(s) => json!({ "seconds": s }),
                Err(e) => json!({ "error": e }),
            };
            (k, v)
        })
        .collect();
    json!({
        "commit": commit,
        "quick": quick,
        "unix_time": super::daemon::unix_now(),
        "nft_f_baseline": baselines,
        "cells": cells.iter().map(CellResult::to_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::manifests;

    fn none<T>() -> Result<T, String> {
        Err("not measured".to_owned())
    }

    fn cell(datapath: &'static str) -> CellResult {
        CellResult {
            scale: manifests::parse_scale("1k/10k").unwrap(),
            datapath,
            source: Source::File,
            full_sync_s: none(),
            served_s: none(),
            changes: none(),
            idle_cpu_pct: none(),
            peak_rss_mib: none(),
            fanout_ms: none(),
            fanout_floor_ms: none(),
            fanout_cpu: none(),
            fanout_delta_ms: none(),
            relist: none(),
            rotation: none(),
            restart: none(),
        }
    }

    fn text(c: &CellResult, figure: &str) -> String {
        let row = rows(c.datapath, c.source)
            .into_iter()
            .find(|r| r.figure.contains(figure))
            .unwrap_or_else(|| panic!("no row {figure:?}"));
        cell_text(&row, c)
    }

    #[test]
    fn exec_to_served_against_each_datapaths_goal() {
        let mut c = cell("ebpf");
        c.served_s = Ok(1.9);
        assert_eq!(text(&c, "exec → served"), "1.90 s met");
        c.served_s = Ok(2.1);
        assert_eq!(text(&c, "exec → served"), "**2.10 s MISSED**");
        let mut n = cell("nftables");
        n.served_s = Ok(4.5);
        assert_eq!(text(&n, "exec → served"), "4.50 s met");
        n.served_s = Err("1 of 3 sampled services answered".to_owned());
        assert_eq!(
            text(&n, "exec → served"),
            "**MISSED: 1 of 3 sampled services answered**"
        );
    }

    #[test]
    fn fanout_over_its_floor_of_the_same_run() {
        let mut c = cell("ebpf");
        c.fanout_ms = Ok(150.0);
        c.fanout_floor_ms = Ok(100.0);
        assert_eq!(text(&c, "÷ that floor"), "1.50× met");
        c.fanout_floor_ms = Ok(50.0);
        assert_eq!(text(&c, "÷ that floor"), "**3.00× MISSED**");
        c.fanout_floor_ms = Err("the fan-out failed".to_owned());
        assert_eq!(text(&c, "÷ that floor"), "**MISSED: the fan-out failed**");
    }
}
