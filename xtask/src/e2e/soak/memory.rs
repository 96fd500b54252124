//! The daemon's RSS and open descriptors, sampled once a second, and
//! whether they stay flat after warm-up.

use std::time::Duration;

/// A daemon process's first seconds (start-up, first list) are not sampled
/// for the flatness check; neither is the soak's own start (the churned
/// services still filling up).
const PROCESS_WARMUP: Duration = Duration::from_secs(10);
const SOAK_WARMUP: Duration = Duration::from_secs(30);

/// One RSS / descriptor reading of the daemon.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    /// Since the soak started, and since this daemon process started.
    pub(super) at: Duration,
    pub(super) age: Duration,
    pub(super) pid: u32,
    pub(super) rss_kib: u64,
    pub(super) fds: u64,
}

/// (VmRSS in KiB, open descriptors) of a live process; `None` once it is
/// gone or a zombie.
pub(super) fn read_proc(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    if field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X')) {
        return None;
    }
    let rss = field("VmRSS:")
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

/// RSS and descriptors: the first restart-free window after warm-up against
/// the last, and the last window's start against its end (one long life:
/// the kill-free tail).
pub(super) struct Flatness {
    windows: Vec<Window>,
}

struct Window {
    pid: u32,
    from: f64,
    to: f64,
    rss: Vec<u64>,
    fds: Vec<u64>,
}

/// "Flat": the later figure at most 10 % + 2 MiB above the earlier one
/// (measured: about 0.5 MiB of noise within one life of a 40 MiB daemon),
/// and at most 8 descriptors more (API server connections come and go with
/// the flapping).
const RSS_TOLERANCE: f64 = 0.10;
const RSS_SLACK_KIB: u64 = 2048;
const FD_SLACK: u64 = 8;
/// Fewer samples than this make no window.
const MIN_WINDOW_SAMPLES: usize = 8;

/// (RSS median in KiB, most open descriptors) over some samples.
type Figures = (u64, u64);

fn median(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

impl Window {
    fn quarter(&self, last: bool) -> Figures {
        let q = (self.rss.len() / 4).max(1);
        let range = if last {
            self.rss.len() - q..self.rss.len()
        } else {
            0..q
        };
        (
            median(&self.rss[range.clone()]),
            self.fds[range].iter().copied().max().unwrap_or(0),
        )
    }

    fn whole(&self) -> Figures {
        (
            median(&self.rss),
            self.fds.iter().copied().max().unwrap_or(0),
        )
    }
}

impl Flatness {
    pub(super) fn of(samples: &[Sample]) -> Flatness {
        let mut windows: Vec<Window> = Vec::new();
        for s in samples
            .iter()
            .filter(|s| s.at >= SOAK_WARMUP && s.age >= PROCESS_WARMUP)
        {
            match windows.last_mut() {
                Some(w) if w.pid == s.pid => {
                    w.to = s.at.as_secs_f64();
                    w.rss.push(s.rss_kib);
                    w.fds.push(s.fds);
                }
                _ => windows.push(Window {
                    pid: s.pid,
                    from: s.at.as_secs_f64(),
                    to: s.at.as_secs_f64(),
                    rss: vec![s.rss_kib],
                    fds: vec![s.fds],
                }),
            }
        }
        windows.retain(|w| w.rss.len() >= MIN_WINDOW_SAMPLES);
        Flatness { windows }
    }

    fn pairs(&self) -> Vec<(String, Figures, Figures)> {
        let (Some(first), Some(last)) = (self.windows.first(), self.windows.last()) else {
            return Vec::new();
        };
        vec![
            (
                format!(
                    "first window (pid {}, {:.0}–{:.0}s) → last window (pid {}, {:.0}–{:.0}s)",
                    first.pid, first.from, first.to, last.pid, last.from, last.to
                ),
                first.whole(),
                last.whole(),
            ),
            (
                format!(
                    "last window's first quarter → its last quarter (pid {})",
                    last.pid
                ),
                last.quarter(false),
                last.quarter(true),
            ),
        ]
    }

    pub(super) fn print(&self) {
        println!(
            "  memory              {} restart-free windows after warm-up; flat = RSS within +{:.0}% +{} MiB, fds within +{}",
            self.windows.len(),
            RSS_TOLERANCE * 100.0,
            RSS_SLACK_KIB / 1024,
            FD_SLACK
        );
        for w in &self.windows {
            println!(
                "      pid {:>7} {:6.0}–{:<6.0}s  RSS median {:>7} KiB (min {}, max {})  fds max {}",
                w.pid,
                w.from,
                w.to,
                median(&w.rss),
                w.rss.iter().min().unwrap_or(&0),
                w.rss.iter().max().unwrap_or(&0),
                w.fds.iter().max().unwrap_or(&0)
            );
        }
        for (what, (rss0, fd0), (rss1, fd1)) in self.pairs() {
            println!("    {what}: RSS {rss0} → {rss1} KiB, fds {fd0} → {fd1}");
        }
    }

    pub(super) fn problems(&self) -> Vec<String> {
        if self.windows.is_empty() {
            return vec![
                "no restart-free window after warm-up to judge RSS and descriptors by".to_owned(),
            ];
        }
        let mut out = Vec::new();
        for (what, (rss0, fd0), (rss1, fd1)) in self.pairs() {
            let allowed = (rss0 as f64 * (1.0 + RSS_TOLERANCE)) as u64 + RSS_SLACK_KIB;
            if rss1 > allowed {
                out.push(format!(
                    "RSS grew {rss0} → {rss1} KiB ({what}; allowed {allowed})"
                ));
            }
            if fd1 > fd0 + FD_SLACK {
                out.push(format!("open descriptors grew {fd0} → {fd1} ({what})"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One process per `lives` entry, sampled once a second for that many
    /// seconds, its RSS at `rss(second of its life)`.
    fn samples(lives: &[u64], rss: impl Fn(u64) -> u64, fds: impl Fn(u64) -> u64) -> Vec<Sample> {
        let mut out = Vec::new();
        let mut at = 0;
        for (pid, &secs) in lives.iter().enumerate() {
            for age in 0..secs {
                out.push(Sample {
                    at: Duration::from_secs(at),
                    age: Duration::from_secs(age),
                    pid: pid as u32 + 1,
                    rss_kib: rss(age),
                    fds: fds(age),
                });
                at += 1;
            }
        }
        out
    }

    #[test]
    fn steady_figures_across_restarts_are_flat() {
        let s = samples(&[40, 30, 60], |age| 40_000 + age % 7 * 50, |_| 22);
        let f = Flatness::of(&s);
        assert_eq!(f.windows.len(), 3, "the first life ends before warm-up");
        assert_eq!(f.problems(), Vec::<String>::new());
    }

    #[test]
    fn rss_growing_within_the_last_life_is_a_leak() {
        // 200 KiB a second: 16 MiB over the long last life.
        let s = samples(&[60, 90], |age| 40_000 + age * 200, |_| 22);
        let problems = Flatness::of(&s).problems();
        assert!(
            problems.iter().any(|p| p.starts_with("RSS grew")),
            "{problems:?}"
        );
    }

    #[test]
    fn descriptors_growing_are_a_leak() {
        let s = samples(&[60, 90], |_| 40_000, |age| 20 + age / 5);
        let problems = Flatness::of(&s).problems();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("open descriptors grew")),
            "{problems:?}"
        );
    }

    #[test]
    fn no_window_after_warm_up_is_no_verdict() {
        let s = samples(&[25], |_| 40_000, |_| 22);
        assert!(!Flatness::of(&s).problems().is_empty());
    }
}
